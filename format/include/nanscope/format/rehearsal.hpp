#pragma once
// Every reader of a file rehearses its read in a forked child first, so a file
// that crashes HDF5 itself becomes a FormatError ("is corrupt") instead of a
// crash (docs/format.md). On by default. The fuzz targets turn it off to
// exercise the readers at full speed, telling HDF5's own crashes from ours.
namespace nanscope::format {

void set_rehearsal(bool on);
bool rehearsal_on();

}  // namespace nanscope::format
