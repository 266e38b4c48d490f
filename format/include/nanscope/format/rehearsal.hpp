#pragma once
// Every reader of a file rehearses its read in a forked child first, so a file
// that crashes HDF5 itself becomes a FormatError ("is corrupt") instead of a
// crash (docs/format.md). On by default. The fuzz targets turn it off to
// exercise the readers at full speed, telling HDF5's own crashes from ours.
#include <functional>
#include <string>

namespace nanscope::format {

void set_rehearsal(bool on);
bool rehearsal_on();

// Runs `reads` (readers of the one file at `path`) under a single
// rehearsal: one child does them all first, then they run here without
// their own. A viewer that opens a file through two readers forks once.
void read_under_one_rehearsal(const std::string& path, const std::function<void()>& reads);

}  // namespace nanscope::format
