// The names of a nested batch's tensors, read from its structure: the JSON
// the Python side writes (nanscope/_batch.py: {"t": i} a tensor leaf, {"d":
// [[key, node], ...]} a dict, {"u": [...]} a tuple, {"l": [...]} a list, {"v":
// value} and {"p": pickled} other leaves). A dict's key names its value,
// positions are [i]: "pixel_values", "[0]", "encoder.input_ids", "[2][1]".
#include <cctype>
#include <stdexcept>

#include "nanscope/probe/batch.hpp"

namespace nanscope {

namespace {

class StructureReader {
 public:
  explicit StructureReader(const std::string& text) : text_(text) {}

  void node(const std::string& path, std::vector<std::string>& names) {
    expect('{');
    const std::string kind = string();
    expect(':');
    if (kind == "t") {
      const int64_t leaf = integer();
      if (leaf >= 0) {
        if (names.size() <= size_t(leaf)) names.resize(size_t(leaf) + 1);
        names[size_t(leaf)] = path;
      }
    } else if (kind == "d") {
      expect('[');
      for (bool first = true; !next_is(']'); first = false) {
        if (!first) expect(',');
        expect('[');
        const std::string key = string();
        expect(',');
        node(path.empty() ? key : path + "." + key, names);
        expect(']');
      }
    } else if (kind == "u" || kind == "l") {
      expect('[');
      for (int64_t i = 0; !next_is(']'); ++i) {
        if (i) expect(',');
        node(path + "[" + std::to_string(i) + "]", names);
      }
    } else {
      value();  // a leaf that is no tensor
    }
    expect('}');
  }

 private:
  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  // Takes `c` if it comes next (a list's loop ends by taking its ']').
  bool next_is(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!next_is(c)) throw std::invalid_argument("batch structure: expected '" + std::string(1, c) + "'");
  }
  std::string string() {
    expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c == '\\' && at_ < text_.size()) {
        c = text_[at_++];
        if (c == 'u') {  // a character outside ASCII, kept as its escape
          out += "\\u" + text_.substr(at_, 4);
          at_ += 4;
          continue;
        }
        c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
      }
      out += c;
    }
    expect('"');
    return out;
  }
  int64_t integer() {
    skip_space();
    size_t used = 0;
    const int64_t value = std::stoll(text_.substr(at_), &used);
    at_ += used;
    return value;
  }
  void value() {  // any JSON value, skipped
    skip_space();
    if (at_ >= text_.size()) throw std::invalid_argument("batch structure: truncated");
    const char c = text_[at_];
    if (c == '"') {
      string();
    } else if (c == '[' || c == '{') {
      const char close = c == '[' ? ']' : '}';
      ++at_;
      for (bool first = true; !next_is(close); first = false) {
        if (!first) expect(',');
        if (close == '}') {
          string();
          expect(':');
        }
        value();
      }
    } else {
      while (at_ < text_.size() && text_[at_] != ',' && text_[at_] != '}' && text_[at_] != ']') ++at_;
    }
  }

  const std::string& text_;
  size_t at_ = 0;
};

}  // namespace

std::vector<std::string> Batch::leaf_names() const {
  std::vector<std::string> names;
  if (!is_nested()) return names;
  try {
    StructureReader(structure).node("", names);
  } catch (const std::exception&) {
    names.clear();  // a structure written otherwise: tensors go unnamed
  }
  names.resize(leaves.size());
  return names;
}

std::string Batch::nonfinite_tensor_name(int64_t row) const {
  if (!is_nested()) return "";
  const int64_t n = rows();
  const std::vector<std::string> names = leaf_names();
  for (size_t i = 0; i < leaves.size(); ++i) {
    const at::Tensor& t = leaves[i];
    if (!t.defined() || !t.is_floating_point()) continue;
    int64_t dim = -1;
    try {
      dim = row_dim_of(t, int64_t(i), n);
    } catch (const std::invalid_argument&) {
      continue;
    }
    if (dim >= 0 && !at::isfinite(t.select(dim, row)).all().item<bool>()) return names[i];
  }
  return "";
}

}  // namespace nanscope
