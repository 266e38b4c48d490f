// The names of a nested batch's tensors, read from its structure: the JSON
// the Python side writes (nanscope/_batch.py: {"t": i} a tensor leaf, {"d":
// [[key, node], ...]} a dict, {"u": [...]} a tuple, {"l": [...]} a list, {"v":
// value} and {"p": pickled} other leaves). A dict's key names its value,
// positions are [i]: "pixel_values", "[0]", "encoder.input_ids", "[2][1]".
#include <cctype>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "nanscope/probe/batch.hpp"

namespace nanscope {

namespace {

// A batch structure's node: a tensor leaf, a dict (keys), a tuple or list
// (positions), or a leaf that is no tensor.
struct Node {
  char kind = 'v';  // 't', 'd', 'u', 'l', 'v'
  int64_t leaf = -1;
  std::vector<std::pair<std::string, Node>> children;  // a dict's keys; "" for positions
};

class StructureReader {
 public:
  explicit StructureReader(const std::string& text) : text_(text) {}

  Node node() {
    Node n;
    expect('{');
    const std::string kind = string();
    expect(':');
    if (kind == "t") {
      n.kind = 't';
      n.leaf = integer();
    } else if (kind == "d") {
      n.kind = 'd';
      expect('[');
      for (bool first = true; !next_is(']'); first = false) {
        if (!first) expect(',');
        expect('[');
        std::string key = string();
        expect(',');
        n.children.emplace_back(std::move(key), node());
        expect(']');
      }
    } else if (kind == "u" || kind == "l") {
      n.kind = kind[0];
      expect('[');
      for (int64_t i = 0; !next_is(']'); ++i) {
        if (i) expect(',');
        n.children.emplace_back("", node());
      }
    } else {
      value();  // a leaf that is no tensor
    }
    expect('}');
    return n;
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

void name_leaves(const Node& n, const std::string& path, std::vector<std::string>& names) {
  if (n.kind == 't' && n.leaf >= 0) {
    if (names.size() <= size_t(n.leaf)) names.resize(size_t(n.leaf) + 1);
    names[size_t(n.leaf)] = path;
  }
  for (size_t i = 0; i < n.children.size(); ++i) {
    const auto& [key, child] = n.children[i];
    name_leaves(child, n.kind == 'd' ? (path.empty() ? key : path + "." + key) : path + "[" + std::to_string(i) + "]",
                names);
  }
}

void leaves_in(const Node& n, std::vector<int64_t>& out) {
  if (n.kind == 't' && n.leaf >= 0) out.push_back(n.leaf);
  for (const auto& child : n.children) leaves_in(child.second, out);
}

std::vector<std::string> keys_of(const Node& n) {
  std::vector<std::string> keys;
  for (const auto& child : n.children) keys.push_back(child.first);
  return keys;
}

// A tuple or list of two or more dicts with the same keys (detection's
// targets): one sample per item.
bool is_list_of_sample_dicts(const Node& n) {
  if ((n.kind != 'u' && n.kind != 'l') || n.children.size() < 2) return false;
  for (const auto& child : n.children)
    if (child.second.kind != 'd' || keys_of(child.second) != keys_of(n.children.front().second)) return false;
  return true;
}

bool is_list_of_tensors(const Node& n) {
  if ((n.kind != 'u' && n.kind != 'l') || n.children.size() < 2) return false;
  for (const auto& child : n.children)
    if (child.second.kind != 't') return false;
  return true;
}

void lists_of(const Node& n, bool (*is)(const Node&), std::vector<const Node*>& out) {
  if (is(n)) {
    out.push_back(&n);
    return;
  }
  for (const auto& child : n.children) lists_of(child.second, is, out);
}

void leaves_in(const Node& n, std::vector<int64_t>& out);

// Whether a list of dicts' tensors all share one size along dimension 0:
// then each item may be a whole batch (two tokenized views of a contrastive
// pair), not one sample.
bool items_share_a_batch_dimension(const Node& list, const std::vector<at::Tensor>& leaves) {
  int64_t size = -1;
  std::vector<int64_t> all;
  leaves_in(list, all);
  for (int64_t leaf : all) {
    if (size_t(leaf) >= leaves.size() || !leaves[size_t(leaf)].defined() || leaves[size_t(leaf)].dim() == 0)
      return false;
    const int64_t first = leaves[size_t(leaf)].size(0);
    if (size >= 0 && first != size) return false;
    size = first;
  }
  return size > 1;
}

// The outermost lists of per-sample items (torchvision's detection batch:
// images as a list of (3, H, W) tensors, targets as a list of dicts): a list
// of dicts with the same keys, where a list of tensors as long stands beside
// it or its items' tensors differ in length (each its own sample's boxes);
// and a list of tensors as long as such a list of dicts.
std::vector<const Node*> sample_lists_in(const Node& root, const std::vector<at::Tensor>& leaves) {
  std::vector<const Node*> dicts, tensors, out;
  lists_of(root, is_list_of_sample_dicts, dicts);
  lists_of(root, is_list_of_tensors, tensors);
  auto as_long = [](const std::vector<const Node*>& lists, const Node* list) {
    for (const Node* other : lists)
      if (other->children.size() == list->children.size()) return true;
    return false;
  };
  for (const Node* d : dicts)
    if (as_long(tensors, d) || !items_share_a_batch_dimension(*d, leaves)) out.push_back(d);
  const std::vector<const Node*> accepted = out;
  for (const Node* t : tensors)
    if (as_long(accepted, t)) out.push_back(t);
  return out;
}

std::optional<Node> parsed(const Batch& batch) {
  if (!batch.is_nested()) return std::nullopt;
  try {
    return StructureReader(batch.structure).node();
  } catch (const std::exception&) {
    return std::nullopt;  // a structure written otherwise: tensors go unnamed, no sample lists
  }
}

}  // namespace

std::vector<std::string> Batch::leaf_names() const {
  std::vector<std::string> names;
  if (const std::optional<Node> root = parsed(*this)) name_leaves(*root, "", names);
  names.resize(leaves.size());
  return names;
}

Batch::SampleLists Batch::sample_lists() const {
  if (sample_lists_ && sample_lists_->structure == structure && sample_lists_->leaves == leaves.size())
    return *sample_lists_;
  SampleLists out;
  out.structure = structure;
  out.leaves = leaves.size();
  out.item_of_leaf.assign(leaves.size(), {-1, -1, -1});
  if (const std::optional<Node> root = parsed(*this)) {
    const std::vector<const Node*> lists = sample_lists_in(*root, leaves);
    bool alike = !lists.empty();
    for (const Node* list : lists) alike &= list->children.size() == lists.front()->children.size();
    if (alike) {
      out.rows = int64_t(lists.front()->children.size());
      for (const Node* list : lists) {
        std::vector<std::vector<int64_t>> items;
        for (const auto& item : list->children) {
          items.emplace_back();
          leaves_in(item.second, items.back());
        }
        const int64_t id = int64_t(out.items.size());
        for (size_t k = 0; k < items.size(); ++k)
          for (size_t j = 0; j < items[k].size(); ++j)
            if (size_t(items[k][j]) < leaves.size())
              out.item_of_leaf[size_t(items[k][j])] = {id, int64_t(k), int64_t(j)};
        out.items.push_back(std::move(items));
      }
    }
  }
  sample_lists_ = std::make_shared<const SampleLists>(out);
  return out;
}

std::string Batch::nonfinite_tensor_name(int64_t row) const {
  if (!is_nested()) return "";
  const int64_t n = rows();
  const std::vector<std::string> names = leaf_names();
  for (size_t i = 0; i < leaves.size(); ++i) {
    const at::Tensor& t = leaves[i];
    if (!t.defined() || !t.is_floating_point()) continue;
    if (sample_of_leaf(i) >= 0) {  // a list item's tensor: its sample's
      if (sample_of_leaf(i) == row && !at::isfinite(t).all().item<bool>()) return names[i];
      continue;
    }
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
