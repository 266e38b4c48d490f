#pragma once
// Reads everything in an archive through the format library's own API, the
// way the programs read snapshots and checkpoints.
#include <string>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"

namespace nanscope::fuzz {

inline void walk_group(const format::Group& group, int depth) {
  if (depth > 16) return;
  for (const std::string& attr : group.attr_names()) {
    try {
      group.attr(attr);
    } catch (const format::FormatError&) {}
  }
  for (const std::string& child : group.children()) {
    try {
      walk_group(group.group(child), depth + 1);
      continue;
    } catch (const format::FormatError&) {}
    try {
      group.tensor(child);
    } catch (const format::FormatError&) {}
    try {
      group.blob(child);
    } catch (const format::FormatError&) {}
  }
}

inline void walk_archive(const std::string& path, const char* kind) {
  try {
    format::Archive archive = format::Archive::open(path, kind);
    walk_group(archive.root(), 0);
  } catch (const format::FormatError&) {}
}

}  // namespace nanscope::fuzz
