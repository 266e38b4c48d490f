#include "h5.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "nanscope/format/version.hpp"
#include "rehearsal.hpp"

namespace nanscope::format::h5 {

void silence_errors() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Every file nanscope opens is closed by its owner; HDF5's exit handler
    // crashed closing one whose close had failed (disk full, HDF5 1.10.8).
    // Must come before any other HDF5 call.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

hid_t check_id(hid_t id, const std::string& path, const std::string& what) {
  if (id < 0) throw FormatError(path, what);
  return id;
}

void check(herr_t status, const std::string& path, const std::string& what) {
  if (status < 0) throw FormatError(path, what);
}

Handle file_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Fclose};
}
Handle group_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Gclose};
}
Handle dataset_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Dclose};
}
Handle space_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Sclose};
}
Handle type_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Tclose};
}
Handle plist_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Pclose};
}
Handle attr_handle(hid_t id, const std::string& path, const std::string& what) {
  return {check_id(id, path, what), H5Aclose};
}

namespace {

// Explains why a file cannot be opened before HDF5 gets a chance to say it
// in its own words: a user needs "missing" and "empty" to read as such.
void check_openable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw FormatError(path, "no such file");
  if (S_ISDIR(st.st_mode)) throw FormatError(path, "is a directory, expected an HDF5 file");
  if (st.st_size == 0) throw FormatError(path, "file is empty");
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) throw FormatError(path, "not an HDF5 file (no HDF5 signature)");
}

}  // namespace

Handle open_file_readonly(const std::string& path) {
  silence_errors();
  check_openable(path);
  // A SWMR reader retries metadata whose checksum fails, since a live writer
  // may be mid-flush; HDF5 1.14 retries a truncated file's metadata for
  // minutes with the default of 100 attempts. A few suffice for a live run.
  Handle fapl = plist_handle(H5Pcreate(H5P_FILE_ACCESS), path, "H5Pcreate");
  check(H5Pset_metadata_read_attempts(fapl.get(), 8), path, "H5Pset_metadata_read_attempts");
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get());
  if (id < 0) id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  return file_handle(id, path, "cannot open HDF5 file (truncated or corrupt?)");
}

Handle open_file_readwrite(const std::string& path) {
  silence_errors();
  check_openable(path);
  return file_handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), path,
                     "cannot open HDF5 file for writing (read-only, in use, or corrupt?)");
}

size_t checked_bytes(hid_t dataset, const std::vector<hsize_t>& dims, size_t element_size, const std::string& path,
                     const std::string& what) {
  constexpr hsize_t kLimit = hsize_t(1) << 62;
  hsize_t bytes = element_size;
  for (hsize_t d : dims) {
    if (d != 0 && bytes > kLimit / d) throw FormatError(path, what + " claims an impossible size (corrupt file?)");
    bytes *= d;
  }
  Handle layout = plist_handle(H5Dget_create_plist(dataset), path, "H5Dget_create_plist");
  // Data kept in other files would be read from paths the file names.
  if (H5Pget_layout(layout.get()) == H5D_VIRTUAL || H5Pget_external_count(layout.get()) > 0)
    throw FormatError(path, what + " keeps its data in other files (not supported)");
  const bool filtered = H5Pget_nfilters(layout.get()) > 0;
  // The bound is the file's size on disk. Not what the file says of itself:
  // a dataset's storage size and the superblock's end of file (which
  // H5Fget_filesize reports when larger) are bytes a corrupt file chooses.
  // Chunks never written (a disk that filled under a live writer) read as
  // fill values, so the data stored for the dataset may fall short of its
  // shape; the whole file may not.
  std::error_code no_size;
  hsize_t file_bytes = std::filesystem::file_size(path, no_size);
  if (no_size) {
    Handle file = file_handle(H5Iget_file_id(dataset), path, "H5Iget_file_id");
    H5Fget_filesize(file.get(), &file_bytes);
  }
  const hsize_t bound = file_bytes;
  // deflate, HDF5's usual filter, expands at most about 1032:1.
  constexpr hsize_t kMostExpansion = 1100;
  const hsize_t expanded = file_bytes > kLimit / kMostExpansion ? kLimit : file_bytes * kMostExpansion;
  const hsize_t memory = hsize_t(sysconf(_SC_PHYS_PAGES)) * hsize_t(sysconf(_SC_PAGESIZE));
  if (!filtered && bytes > bound)
    throw FormatError(path, what + " claims " + std::to_string(bytes) + " bytes, more than the whole file (" +
                                std::to_string(file_bytes) + " bytes; corrupt or truncated?)");
  if (filtered && bytes > std::min(expanded, memory))
    throw FormatError(path, what + " claims " + std::to_string(bytes) + " bytes, more than its compressed file (" +
                                std::to_string(file_bytes) + " bytes) can hold (corrupt?)");
  // HDF5 allocates (and zeroes) a whole chunk to read any part of it.
  if (H5Pget_layout(layout.get()) == H5D_CHUNKED) {
    const int rank = H5Pget_chunk(layout.get(), 0, nullptr);
    std::vector<hsize_t> chunk(rank > 0 ? size_t(rank) : 0);
    if (rank > 0) H5Pget_chunk(layout.get(), rank, chunk.data());
    hsize_t chunk_bytes = element_size;
    for (hsize_t c : chunk) chunk_bytes = (c != 0 && chunk_bytes > kLimit / c) ? kLimit : chunk_bytes * c;
    constexpr hsize_t kLargestChunk = hsize_t(64) << 20;
    if (chunk_bytes > std::max(bound, kLargestChunk))
      throw FormatError(path, what + " is stored in chunks of " + std::to_string(chunk_bytes) +
                                  " bytes, more than the whole file (corrupt?)");
  }
  return size_t(bytes);
}

bool link_exists(hid_t loc, const std::string& name) { return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0; }

bool attr_exists(hid_t loc, const std::string& name) { return H5Aexists(loc, name.c_str()) > 0; }

Handle fixed_string_type(size_t n, const std::string& path) {
  Handle type = type_handle(H5Tcopy(H5T_C_S1), path, "H5Tcopy");
  check(H5Tset_size(type.get(), n == 0 ? 1 : n), path, "H5Tset_size");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), path, "H5Tset_strpad");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), path, "H5Tset_cset");
  return type;
}

namespace {

Handle create_attr(hid_t loc, const std::string& name, hid_t type, const std::string& path) {
  if (attr_exists(loc, name)) check(H5Adelete(loc, name.c_str()), path, "replace attribute " + name);
  Handle space = space_handle(H5Screate(H5S_SCALAR), path, "H5Screate");
  return attr_handle(H5Acreate2(loc, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), path,
                     "cannot create attribute '" + name + "'");
}

Handle open_attr(hid_t loc, const std::string& name, const std::string& path) {
  if (!attr_exists(loc, name)) throw FormatError(path, "attribute '" + name + "' missing");
  return attr_handle(H5Aopen(loc, name.c_str(), H5P_DEFAULT), path, "cannot open attribute '" + name + "'");
}

}  // namespace

void write_string_attr(hid_t loc, const std::string& name, const std::string& value, const std::string& path) {
  Handle type = fixed_string_type(value.size(), path);
  Handle attr = create_attr(loc, name, type.get(), path);
  const char* data = value.empty() ? "" : value.data();
  check(H5Awrite(attr.get(), type.get(), data), path, "write attribute " + name);
}

std::string read_string_attr(hid_t loc, const std::string& name, const std::string& path) {
  Handle attr = open_attr(loc, name, path);
  Handle type = type_handle(H5Aget_type(attr.get()), path, "H5Aget_type");
  if (H5Tget_class(type.get()) != H5T_STRING) throw FormatError(path, "attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    // Written by another tool (h5py writes variable-length strings by default).
    char* value = nullptr;
    Handle mem = type_handle(H5Tcopy(H5T_C_S1), path, "H5Tcopy");
    H5Tset_size(mem.get(), H5T_VARIABLE);
    // h5py's are UTF-8: HDF5 converts no string between character sets.
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    check(H5Aread(attr.get(), mem.get(), &value), path, "read attribute " + name);
    std::string out = value ? value : "";
    H5free_memory(value);
    return out;
  }
  size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  check(H5Aread(attr.get(), type.get(), out.data()), path, "read attribute " + name);
  out.resize(std::strlen(out.c_str()));
  return out;
}

void write_int_attr(hid_t loc, const std::string& name, int64_t value, const std::string& path) {
  Handle attr = create_attr(loc, name, H5T_STD_I64LE, path);
  check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), path, "write attribute " + name);
}

namespace {

std::string type_description(hid_t type) {
  const std::string bits = std::to_string(H5Tget_size(type) * 8) + "-bit ";
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return bits + "integer";
    case H5T_FLOAT: return bits + "float";
    case H5T_STRING: return "string";
    default: return "HDF5 type of class " + std::to_string(int(H5Tget_class(type)));
  }
}

}  // namespace

void require_stored_type(hid_t dataset, hid_t expected, const std::string& path, const std::string& what) {
  Handle type = type_handle(H5Dget_type(dataset), path, "H5Dget_type");
  if (H5Tequal(type.get(), expected) > 0) return;
  std::string stored = "a " + type_description(type.get());
  if (stored == "a " + type_description(expected)) stored += " of another layout (byte order, precision or offsets)";
  throw FormatError(path, what + " is stored as " + stored + ", not as the little-endian " +
                              type_description(expected) + " nanscope writes (corrupt, or not written by nanscope?)");
}

void require_standard_number(hid_t type, const std::string& path, const std::string& what) {
  for (hid_t standard :
       {H5T_STD_I8LE,  H5T_STD_I8BE,  H5T_STD_U8LE,   H5T_STD_U8BE,   H5T_STD_I16LE,  H5T_STD_I16BE, H5T_STD_U16LE,
        H5T_STD_U16BE, H5T_STD_I32LE, H5T_STD_I32BE,  H5T_STD_U32LE,  H5T_STD_U32BE,  H5T_STD_I64LE, H5T_STD_I64BE,
        H5T_STD_U64LE, H5T_STD_U64BE, H5T_IEEE_F32LE, H5T_IEEE_F32BE, H5T_IEEE_F64LE, H5T_IEEE_F64BE})
    if (H5Tequal(type, standard) > 0) return;
  throw FormatError(
      path, what + " is stored as a " + type_description(type) + ", not a standard integer or float (corrupt?)");
}

int64_t read_int_attr(hid_t loc, const std::string& name, const std::string& path) {
  Handle attr = open_attr(loc, name, path);
  Handle type = type_handle(H5Aget_type(attr.get()), path, "H5Aget_type");
  require_standard_number(type.get(), path, "attribute '" + name + "'");
  int64_t value = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), path, "attribute '" + name + "' is not an integer");
  return value;
}

void write_double_attr(hid_t loc, const std::string& name, double value, const std::string& path) {
  Handle attr = create_attr(loc, name, H5T_IEEE_F64LE, path);
  check(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value), path, "write attribute " + name);
}

double read_double_attr(hid_t loc, const std::string& name, const std::string& path) {
  Handle attr = open_attr(loc, name, path);
  Handle type = type_handle(H5Aget_type(attr.get()), path, "H5Aget_type");
  require_standard_number(type.get(), path, "attribute '" + name + "'");
  double value = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value), path, "attribute '" + name + "' is not a number");
  return value;
}

namespace {

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

herr_t collect_link_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

}  // namespace

std::vector<std::string> attr_names(hid_t loc, const std::string& path) {
  std::vector<std::string> names;
  hsize_t index = 0;
  check(H5Aiterate2(loc, H5_INDEX_NAME, H5_ITER_INC, &index, collect_attr_name, &names), path,
        "cannot list attributes");
  return names;
}

std::vector<std::string> child_names(hid_t loc, const std::string& path) {
  std::vector<std::string> names;
  hsize_t index = 0;
  check(H5Literate(loc, H5_INDEX_NAME, H5_ITER_INC, &index, collect_link_name, &names), path,
        "cannot list group members");
  return names;
}

void write_identity(hid_t file, const std::string& kind, const std::string& path) {
  write_string_attr(file, "format", kind, path);
  write_string_attr(file, "format_version", std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor), path);
}

FileVersion check_identity(hid_t file, const std::string& kind, const std::string& path) {
  if (!attr_exists(file, "format"))
    throw FormatError(path, "not a nanscope file: the root has no 'format' attribute (expected " + kind + ")");
  std::string found = read_string_attr(file, "format", path);
  if (found != kind) throw FormatError(path, "is a '" + found + "' file, expected " + kind);
  if (!attr_exists(file, "format_version")) throw FormatError(path, "'format_version' attribute missing");
  std::string version = read_string_attr(file, "format_version", path);
  const std::optional<FileVersion> parsed = parse_file_version(version);
  if (!parsed) throw FormatError(path, "unreadable format_version '" + version + "'");
  const int major = parsed->major;
  if (major != kFormatMajor)
    throw FormatError(path, "format_version " + version + " is not supported (this nanscope reads " +
                                std::to_string(kFormatMajor) + ".x; " +
                                (major > kFormatMajor ? "upgrade nanscope)" : "file too old)"));
  return *parsed;
}

}  // namespace nanscope::format::h5

namespace nanscope::format {

std::optional<FileVersion> parse_file_version(const std::string& text) {
  const size_t dot = text.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 >= text.size()) return std::nullopt;
  for (size_t i = 0; i < text.size(); ++i)
    if (i != dot && (text[i] < '0' || text[i] > '9')) return std::nullopt;
  try {
    return FileVersion{std::stoi(text.substr(0, dot)), std::stoi(text.substr(dot + 1))};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string file_kind(const std::string& path) {
  h5::rehearse_in_child(path, [&] { h5::walk_metadata(path); });
  h5::Handle file = h5::open_file_readonly(path);
  if (!h5::attr_exists(file.get(), "format"))
    throw FormatError(path, "not a nanscope file: the root has no 'format' attribute");
  std::string kind = h5::read_string_attr(file.get(), "format", path);
  h5::check_identity(file.get(), kind, path);  // the version check
  return kind;
}

}  // namespace nanscope::format
