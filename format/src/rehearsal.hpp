#pragma once
// The defence for files from outside. HDF5 1.10 itself crashes on some
// malformed files (a few flipped bits in a snapshot made H5Aiterate2 fault
// inside the library; many CVEs are of this kind), and no check in our code
// can catch a fault inside HDF5. So each reader first does its read in a
// forked child: the child has the parent's exact memory, so it meets the same
// crash the parent would, and a child that dies by a signal (or hangs) turns
// into a FormatError "corrupt" for the parent, which never touched the bad
// bytes. Only format/src uses this.
#include <functional>
#include <string>

namespace nanscope::format::h5 {

// Runs `read` in a forked child, then returns (inside a child already: at
// once). Throws FormatError(path, ...) when the child was killed by a signal
// or did not finish in 30 s. Anything else (success, an exception, HDF5 error)
// returns: the caller then reads for real and reports its own errors.
void rehearse_in_child(const std::string& path, const std::function<void()>& read);

// An archive's reads come later, one call at a time; its rehearsal is a walk
// of everything the readers touch: every group and attribute listed by name
// (the readers' order, which makes HDF5 build the same tables), every
// attribute read, every dataset's type, shape and layout, small datasets read.
void walk_metadata(const std::string& path);

}  // namespace nanscope::format::h5
