#pragma once
// Schema identity shared by every nanscope file (docs/format.md).
namespace nanscope::format {

// Readers accept any minor version of a major they know and reject a newer major.
inline constexpr int kFormatMajor = 1;
inline constexpr int kFormatMinor = 0;

// The root attribute `format` says which kind of nanscope file this is.
inline constexpr const char* kRunFileKind = "nanscope-run";
inline constexpr const char* kSnapshotFileKind = "nanscope-snapshot";
inline constexpr const char* kCheckpointFileKind = "nanscope-checkpoint";

}  // namespace nanscope::format
