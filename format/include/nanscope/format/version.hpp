#pragma once
// Schema identity shared by every nanscope file (docs/format.md).
#include <string>
namespace nanscope::format {

// Readers accept any minor version of a major they know and reject a newer major.
inline constexpr int kFormatMajor = 1;
inline constexpr int kFormatMinor = 0;

// The root attribute `format` says which kind of nanscope file this is.
inline constexpr const char* kRunFileKind = "nanscope-run";
inline constexpr const char* kSnapshotFileKind = "nanscope-snapshot";
inline constexpr const char* kCheckpointFileKind = "nanscope-checkpoint";

// The kind of a nanscope file (one of the k*FileKind above), for readers that
// take any of them (the viewer). Throws FormatError naming the file when it is
// missing, not HDF5, not a nanscope file, or of a newer major version.
std::string file_kind(const std::string& path);

}  // namespace nanscope::format
