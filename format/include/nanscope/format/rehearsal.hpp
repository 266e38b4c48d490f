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
// The child reads first and this process follows it part by part: a part
// is read here only once the child has read it and gone on, so the
// rehearsal costs about one part's read where a second core is free.
void read_under_one_rehearsal(const std::string& path, const std::function<void()>& reads);

// Where a read's parts meet; readers call it before each bulk read. In a
// rehearsing child: one more part done. In a process reading behind its
// child (read_under_one_rehearsal): waits until the child has read the part
// this call begins. Elsewhere nothing. Both processes run the same code, so
// they count the same parts.
void rehearsal_checkpoint();

}  // namespace nanscope::format
