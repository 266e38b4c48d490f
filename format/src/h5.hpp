#pragma once
// The small wrapper around the HDF5 C API. Only format/src includes this file:
// nothing else in nanscope calls HDF5. Every status is checked here and turned
// into a FormatError naming the file; HDF5's own error stack is never printed.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/format/error.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::format::h5 {

// Turns off HDF5's automatic error printing (idempotent, thread-safe enough: it
// only ever stores the same null handler).
void silence_errors();

// An owned hid_t closed with the matching H5*close on destruction.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept { *this = std::move(other); }
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      closer_ = other.closer_;
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership: the caller closes it (and sees whether that worked).
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Checks an id/status from HDF5 and throws FormatError(path, what) on failure.
hid_t check_id(hid_t id, const std::string& path, const std::string& what);
void check(herr_t status, const std::string& path, const std::string& what);

Handle file_handle(hid_t id, const std::string& path, const std::string& what);
Handle group_handle(hid_t id, const std::string& path, const std::string& what);
Handle dataset_handle(hid_t id, const std::string& path, const std::string& what);
Handle space_handle(hid_t id, const std::string& path, const std::string& what);
Handle type_handle(hid_t id, const std::string& path, const std::string& what);
Handle plist_handle(hid_t id, const std::string& path, const std::string& what);
Handle attr_handle(hid_t id, const std::string& path, const std::string& what);

// Opens a file read-only. Tries SWMR-read first so a file being written (or left
// by a killed writer) opens; falls back to a plain open for older-format files.
// Gives clear errors for missing, empty and non-HDF5 files.
Handle open_file_readonly(const std::string& path);
Handle open_file_readwrite(const std::string& path);

bool link_exists(hid_t loc, const std::string& name);
// The bytes `dims` x `element_size` of a dataset come to, refused with a
// FormatError naming `what` when a corrupt shape claims more than the whole
// file holds (compressed: more than deflate can expand it to, or than this
// machine's memory):
// a flipped bit in a shape must not become a giant allocation.
size_t checked_bytes(hid_t dataset, const std::vector<hsize_t>& dims, size_t element_size, const std::string& path,
                     const std::string& what);
bool attr_exists(hid_t loc, const std::string& name);

// Corrupt fields of a stored type (a float's precision, say) send HDF5's
// conversions down paths that crash it, and a reader's rehearsal in a child
// reads in the stored type, without converting. So archive datasets must be
// stored in exactly the type nanscope writes them in (the read is then a
// copy), and numeric attributes in one of HDF5's standard integer or IEEE
// float types (converted by HDF5's fixed, table-driven routines). Both throw a
// FormatError naming `what`.
void require_stored_type(hid_t dataset, hid_t expected, const std::string& path, const std::string& what);
void require_standard_number(hid_t type, const std::string& path, const std::string& what);

// String attributes (fixed-length, UTF-8): readable by h5py and h5dump.
void write_string_attr(hid_t loc, const std::string& name, const std::string& value, const std::string& path);
std::string read_string_attr(hid_t loc, const std::string& name, const std::string& path);
void write_int_attr(hid_t loc, const std::string& name, int64_t value, const std::string& path);
int64_t read_int_attr(hid_t loc, const std::string& name, const std::string& path);
void write_double_attr(hid_t loc, const std::string& name, double value, const std::string& path);
double read_double_attr(hid_t loc, const std::string& name, const std::string& path);
std::vector<std::string> attr_names(hid_t loc, const std::string& path);
std::vector<std::string> child_names(hid_t loc, const std::string& path);

// Stamps `format` and `format_version` on a new file's root.
void write_identity(hid_t file, const std::string& kind, const std::string& path);
// Checks `format` and `format_version`; throws a FormatError saying what is
// wrong. Returns the file's version, for readers to branch on.
FileVersion check_identity(hid_t file, const std::string& kind, const std::string& path);

// A fixed-length string type of n bytes, null-padded (h5py reads it as bytes).
Handle fixed_string_type(size_t n, const std::string& path);

}  // namespace nanscope::format::h5
