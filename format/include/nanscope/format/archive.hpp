#pragma once
// A small typed view of an HDF5 file for snapshots and checkpoints: nested
// groups holding named tensors (dtype + shape + raw bytes), attributes and
// opaque byte blobs. No LibTorch here: tensors are plain bytes so the viewer
// can read snapshots without it (docs/format.md).
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "nanscope/format/version.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope::format {

enum class DType : uint8_t { float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, boolean };

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
// Throws std::invalid_argument for a name that is not a DType.
DType dtype_from_name(const std::string& name);

struct TensorData {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;  // empty: a scalar
  std::vector<uint8_t> bytes;  // row-major, native byte order
  int64_t numel() const;
};

// An integer tensor (any integer dtype) as int64 values; throws FormatError
// naming `path` and `what` for a floating one.
std::vector<int64_t> int_values(const TensorData& t, const std::string& path, const std::string& what);

using AttrValue = std::variant<int64_t, double, std::string>;

class Group {
 public:
  // Opens a child group; creates it when the archive is writable and it is missing.
  Group group(const std::string& name) const;
  bool has(const std::string& name) const;
  // Unlinks a child (group or dataset); no-op when absent.
  void remove(const std::string& name) const;
  std::vector<std::string> children() const;

  void put_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data) const;
  TensorData tensor(const std::string& name) const;
  // A stored tensor's dtype and shape, its bytes left unread (out.bytes empty).
  TensorData tensor_shape(const std::string& name) const;

  void put_blob(const std::string& name, const void* data, size_t size) const;
  std::string blob(const std::string& name) const;
  int64_t blob_size(const std::string& name) const;

  void set_attr(const std::string& name, const AttrValue& value) const;
  bool has_attr(const std::string& name) const;
  AttrValue attr(const std::string& name) const;
  std::string attr_string(const std::string& name) const;
  // A vocabulary word (vocabulary.hpp) as its spelling; read back, a word
  // this version does not know is Word::unknown.
  template <typename Word>
  void set_word(const std::string& name, Word word) const {
    set_attr(name, std::string(to_string(word)));
  }
  template <typename Word>
  Word word(const std::string& name) const {
    return from_string_or_unknown<Word>(attr_string(name));
  }
  int64_t attr_int(const std::string& name) const;
  double attr_double(const std::string& name) const;
  std::vector<std::string> attr_names() const;

  const std::string& name() const;       // absolute path inside the file, "/" for the root
  const std::string& file_path() const;  // the file's path, for messages

  struct State;
  explicit Group(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

class Archive {
 public:
  // Creates a file of the given kind (version.hpp's k*FileKind). It is
  // written straight to PATH.part, a tensor at a time (a model's snapshot
  // costs no copy of the model in memory), and close() renames it over PATH:
  // a reader never sees half a file, a full disk surfaces as one WriteError,
  // and an archive that fails or is dropped before close() leaves nothing.
  static Archive create(const std::string& path, const std::string& kind);
  // Opens an existing file and checks its kind and major version.
  static Archive open(const std::string& path, const std::string& kind, bool writable = false);

  Group root() const;
  const std::string& path() const;
  // The file's format_version (a created archive: this nanscope's).
  FileVersion version() const;
  // Flushes (and, for a created archive, writes the file); further use of its
  // groups fails. Errors surface here, not silently in a destructor: an
  // archive destroyed without close() writes nothing.
  void close();

  struct File;

 private:
  std::shared_ptr<File> file_;
};

}  // namespace nanscope::format
