#include "nanscope/format/archive.hpp"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "h5.hpp"
#include "h5_types.hpp"
#include "nanscope/format/error.hpp"
#include "rehearsal.hpp"

namespace nanscope::format {

struct Archive::File {
  std::string path;
  bool writable = false;
  std::string part;  // created: written as PATH.part, renamed over PATH by close()
  h5::Handle handle;
  FileVersion version;  // opened: the file's; created: this nanscope's
  size_t datasets = 0;  // written so far: each leaves metadata for the close to write

  // HDF5 2.x aborts the process (an assertion in H5F__dest) when a file's
  // metadata cannot be written at its close, where 1.10 returned an error; a
  // full disk would end the training run. So a created archive never lets
  // HDF5 meet a full disk: before each dataset it checks that the file system
  // has room for the data and for the metadata still to come, and throws the
  // WriteError a failed write would have given, while the close can still
  // write what exists so far.
  void make_room(uint64_t bytes) {
    if (part.empty()) return;
    ++datasets;
    constexpr uint64_t kMetadataMargin = 256 << 10, kMetadataPerDataset = 8 << 10;
    const uint64_t needed = bytes + kMetadataMargin + kMetadataPerDataset * datasets;
    const std::string dir = std::filesystem::path(part).parent_path().string();
    struct statvfs fs {};
    if (statvfs(dir.empty() ? "." : dir.c_str(), &fs) != 0) return;  // cannot tell: the write says
    const uint64_t free = uint64_t(fs.f_bavail) * fs.f_frsize;
    if (free < needed)
      throw WriteError(path, "cannot write file (disk full?): " + std::to_string(free >> 10) + " KiB free, " +
                                 std::to_string(needed >> 10) + " KiB needed");
  }

  // An archive dropped before close() (an error while writing it) leaves nothing behind.
  ~File() {
    if (part.empty()) return;
    handle.reset();
    std::remove(part.c_str());
  }
};

struct Group::State {
  std::shared_ptr<Archive::File> file;
  std::string name;
  h5::Handle handle;
};

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::float32, "float32", 4},   {DType::float64, "float64", 8}, {DType::float16, "float16", 2},
    {DType::bfloat16, "bfloat16", 2}, {DType::int64, "int64", 8},     {DType::int32, "int32", 4},
    {DType::int16, "int16", 2},       {DType::int8, "int8", 1},       {DType::uint8, "uint8", 1},
    {DType::boolean, "bool", 1},
};

std::string child_path(const std::string& parent, const std::string& name) {
  return parent == "/" ? "/" + name : parent + "/" + name;
}

std::shared_ptr<Group::State> root_state(const std::shared_ptr<Archive::File>& file) {
  auto state = std::make_shared<Group::State>();
  state->file = file;
  state->name = "/";
  state->handle =
      h5::group_handle(H5Gopen2(file->handle.get(), "/", H5P_DEFAULT), file->path, "cannot open the root group");
  return state;
}

}  // namespace

const char* dtype_name(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

size_t dtype_size(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 1;
}

DType dtype_from_name(const std::string& name) {
  for (const auto& info : kDTypes)
    if (name == info.name) return info.dtype;
  throw std::invalid_argument("unknown dtype '" + name + "'");
}

int64_t TensorData::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> int_values(const TensorData& t, const std::string& path, const std::string& what) {
  std::vector<int64_t> out(t.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = t.bytes.data() + i * dtype_size(t.dtype);
    switch (t.dtype) {
      case DType::int64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out[i] = v;
        break;
      }
      case DType::int32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        out[i] = v;
        break;
      }
      case DType::int16: {
        int16_t v;
        std::memcpy(&v, p, 2);
        out[i] = v;
        break;
      }
      case DType::int8: out[i] = int8_t(*p); break;
      case DType::uint8: out[i] = *p; break;
      default: throw FormatError(path, what + " is " + dtype_name(t.dtype) + ", expected integers");
    }
  }
  return out;
}

Group Group::group(const std::string& name) const {
  const std::string& path = state_->file->path;
  auto child = std::make_shared<State>();
  child->file = state_->file;
  child->name = child_path(state_->name, name);
  hid_t loc = state_->handle.get();
  if (h5::link_exists(loc, name)) {
    child->handle =
        h5::group_handle(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), path, "cannot open group " + child->name);
  } else if (state_->file->writable) {
    child->handle = h5::group_handle(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                                     "cannot create group " + child->name);
  } else {
    throw FormatError(path, child->name + " missing");
  }
  return Group(child);
}

bool Group::has(const std::string& name) const { return h5::link_exists(state_->handle.get(), name); }

void Group::remove(const std::string& name) const {
  if (!has(name)) return;
  h5::check(H5Ldelete(state_->handle.get(), name.c_str(), H5P_DEFAULT), state_->file->path,
            "cannot remove " + child_path(state_->name, name));
}

std::vector<std::string> Group::children() const { return h5::child_names(state_->handle.get(), state_->file->path); }

const std::string& Group::name() const { return state_->name; }

void Group::put_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                       const void* data) const {
  const std::string& path = state_->file->path;
  const std::string full = child_path(state_->name, name);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  state_->file->make_room(uint64_t(numel) * H5Tget_size(h5::file_type(dtype)));
  h5::Handle space =
      h5::space_handle(dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                       path, "H5Screate");
  h5::Handle ds = h5::dataset_handle(H5Dcreate2(state_->handle.get(), name.c_str(), h5::file_type(dtype), space.get(),
                                                H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                     path, "cannot create tensor " + full);
  h5::write_string_attr(ds.get(), "dtype", dtype_name(dtype), path);
  if (numel > 0)
    h5::check(H5Dwrite(ds.get(), h5::memory_type(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path,
              "cannot write tensor " + full + " (disk full?)");
}

namespace {

// A tensor's dataset, opened and checked against its dtype attribute; `out`
// gets the dtype.
h5::Handle open_tensor(const Group& group, hid_t parent, const std::string& name, TensorData& out) {
  const std::string& path = group.file_path();
  const std::string full = child_path(group.name(), name);
  if (!group.has(name)) throw FormatError(path, full + " missing");
  h5::Handle ds = h5::dataset_handle(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), path, "cannot open tensor " + full);
  if (!h5::attr_exists(ds.get(), "dtype")) throw FormatError(path, full + " has no dtype attribute");
  try {
    out.dtype = dtype_from_name(h5::read_string_attr(ds.get(), "dtype", path));
  } catch (const std::invalid_argument& e) {
    throw FormatError(path, full + ": " + e.what());
  }
  h5::require_stored_type(ds.get(), h5::file_type(out.dtype), path, full);
  return ds;
}

}  // namespace

TensorData Group::tensor(const std::string& name) const {
  TensorData out;
  h5::Handle ds = open_tensor(*this, state_->handle.get(), name, out);
  h5::read_tensor_data(ds.get(), out, file_path(), "tensor " + child_path(state_->name, name));
  return out;
}

TensorData Group::tensor_shape(const std::string& name) const {
  TensorData out;
  h5::Handle ds = open_tensor(*this, state_->handle.get(), name, out);
  const std::vector<hsize_t> dims = h5::dataset_dims(ds.get(), file_path(), "tensor " + child_path(state_->name, name));
  out.shape.assign(dims.begin(), dims.end());
  return out;
}

void Group::put_blob(const std::string& name, const void* data, size_t size) const {
  const std::string& path = state_->file->path;
  hsize_t n = size;
  state_->file->make_room(size);
  h5::Handle space = h5::space_handle(H5Screate_simple(1, &n, nullptr), path, "H5Screate");
  h5::Handle ds = h5::dataset_handle(
      H5Dcreate2(state_->handle.get(), name.c_str(), H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      path, "cannot create blob " + child_path(state_->name, name));
  h5::write_string_attr(ds.get(), "dtype", "blob", path);
  if (size > 0)
    h5::check(H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path,
              "cannot write blob (disk full?)");
}

int64_t Group::blob_size(const std::string& name) const {
  const std::string& path = state_->file->path;
  const std::string full = child_path(state_->name, name);
  if (!has(name)) throw FormatError(path, full + " missing");
  h5::Handle ds =
      h5::dataset_handle(H5Dopen2(state_->handle.get(), name.c_str(), H5P_DEFAULT), path, "cannot open blob " + full);
  h5::require_stored_type(ds.get(), H5T_STD_U8LE, path, "blob " + full);
  const std::vector<hsize_t> dims = h5::dataset_dims(ds.get(), path, "blob " + full);
  if (dims.size() != 1) throw FormatError(path, "blob " + full + " is not one row of bytes");
  return int64_t(dims[0]);
}

std::string Group::blob(const std::string& name) const {
  const std::string& path = state_->file->path;
  const std::string full = child_path(state_->name, name);
  if (!has(name)) throw FormatError(path, full + " missing");
  h5::Handle ds =
      h5::dataset_handle(H5Dopen2(state_->handle.get(), name.c_str(), H5P_DEFAULT), path, "cannot open blob " + full);
  h5::Handle space = h5::space_handle(H5Dget_space(ds.get()), path, "H5Dget_space");
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) throw FormatError(path, full + " has no size");
  h5::require_stored_type(ds.get(), H5T_STD_U8LE, path, "blob " + full);
  std::string out(h5::checked_bytes(ds.get(), {hsize_t(n)}, 1, path, full), '\0');
  if (n > 0)
    h5::check(H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), path,
              "cannot read blob " + full + " (corrupt or truncated file?)");
  return out;
}

void Group::set_attr(const std::string& name, const AttrValue& value) const {
  const std::string& path = state_->file->path;
  hid_t loc = state_->handle.get();
  if (auto* i = std::get_if<int64_t>(&value))
    h5::write_int_attr(loc, name, *i, path);
  else if (auto* d = std::get_if<double>(&value))
    h5::write_double_attr(loc, name, *d, path);
  else
    h5::write_string_attr(loc, name, std::get<std::string>(value), path);
}

bool Group::has_attr(const std::string& name) const { return h5::attr_exists(state_->handle.get(), name); }

AttrValue Group::attr(const std::string& name) const {
  const std::string& path = state_->file->path;
  hid_t loc = state_->handle.get();
  if (!has_attr(name)) throw FormatError(path, state_->name + " attribute '" + name + "' missing");
  h5::Handle a = h5::attr_handle(H5Aopen(loc, name.c_str(), H5P_DEFAULT), path, "H5Aopen " + name);
  h5::Handle type = h5::type_handle(H5Aget_type(a.get()), path, "H5Aget_type");
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: return h5::read_int_attr(loc, name, path);
    case H5T_FLOAT: return h5::read_double_attr(loc, name, path);
    case H5T_STRING: return h5::read_string_attr(loc, name, path);
    default: throw FormatError(path, "attribute '" + name + "' has an unsupported type");
  }
}

std::string Group::attr_string(const std::string& name) const {
  AttrValue v = attr(name);
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  throw FormatError(state_->file->path, state_->name + " attribute '" + name + "' is not a string");
}

int64_t Group::attr_int(const std::string& name) const {
  AttrValue v = attr(name);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  throw FormatError(state_->file->path, state_->name + " attribute '" + name + "' is not an integer");
}

double Group::attr_double(const std::string& name) const {
  AttrValue v = attr(name);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
  throw FormatError(state_->file->path, state_->name + " attribute '" + name + "' is not a number");
}

const std::string& Group::file_path() const { return state_->file->path; }

std::vector<std::string> Group::attr_names() const { return h5::attr_names(state_->handle.get(), state_->file->path); }

Archive Archive::create(const std::string& path, const std::string& kind) {
  h5::silence_errors();
  Archive archive;
  archive.file_ = std::make_shared<File>();
  archive.file_->path = path;
  archive.file_->writable = true;
  // Straight to disk, one tensor at a time, so writing a model costs no copy
  // of it in memory; as PATH.part, so no reader ever sees half a file.
  const std::string part = path + ".part";
  // close() renames the file into place: it must be closed for good by then,
  // with groups of the writer's still alive. HDF5 2.x writes the file's last
  // bytes (up to the end its superblock records) only at that final close, so
  // a file renamed after a weak close and then SIGKILLed was short by them.
  h5::Handle fapl = h5::plist_handle(H5Pcreate(H5P_FILE_ACCESS), path, "H5Pcreate");
  h5::check(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), path, "H5Pset_fclose_degree");
  archive.file_->handle = h5::file_handle(H5Fcreate(part.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), path,
                                          "cannot create file (directory missing or not writable?)");
  archive.file_->part = part;
  h5::write_identity(archive.file_->handle.get(), kind, path);
  return archive;
}

Archive Archive::open(const std::string& path, const std::string& kind, bool writable) {
  Archive archive;
  archive.file_ = std::make_shared<File>();
  archive.file_->path = path;
  archive.file_->writable = writable;
  h5::rehearse_in_child(path, [&] { h5::walk_metadata(path); });
  archive.file_->handle = writable ? h5::open_file_readwrite(path) : h5::open_file_readonly(path);
  archive.file_->version = h5::check_identity(archive.file_->handle.get(), kind, path);
  return archive;
}

FileVersion Archive::version() const { return file_ ? file_->version : FileVersion{}; }

Group Archive::root() const {
  if (!file_ || !file_->handle.valid()) throw std::logic_error("archive is closed");
  return Group(root_state(file_));
}

const std::string& Archive::path() const { return file_->path; }

void Archive::close() {
  if (!file_ || !file_->handle.valid()) return;
  const bool flushed = H5Fflush(file_->handle.get(), H5F_SCOPE_GLOBAL) >= 0;
  // A created file closes with the groups still open (H5F_CLOSE_STRONG: their
  // handles' own closes later fail quietly); one opened to be read closes for
  // good once its groups go (H5F_CLOSE_WEAK, the default).
  const bool closed = H5Fclose(file_->handle.release()) >= 0;
  if (file_->part.empty()) {
    if (!flushed || !closed) throw FormatError(file_->path, "cannot flush (disk full?)");
    return;
  }
  const std::string part = std::exchange(file_->part, std::string());
  if (!flushed || !closed) {
    std::remove(part.c_str());
    throw WriteError(file_->path, "cannot write file (disk full?)");
  }
  if (std::rename(part.c_str(), file_->path.c_str()) != 0) {
    const int error = errno;
    std::remove(part.c_str());
    throw WriteError(file_->path, std::string("cannot move the written file into place: ") + std::strerror(error));
  }
}

}  // namespace nanscope::format
