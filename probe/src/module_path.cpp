#include "module_path.hpp"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/torchscript_modules.hpp"

namespace nanscope::probe {

namespace {

struct ModuleTree {
  std::vector<std::pair<std::string, std::string>> modules;  // path, class; named_modules() order
};

// Each registered module object's path, for frames that hand over `self`.
// Weak: a model that is gone leaves no module alive, and its addresses may be
// reused, which the weak pointer tells apart.
struct ObjectPath {
  c10::weak_intrusive_ptr<c10::ivalue::Object> object;
  std::string path;
};
std::map<const c10::ivalue::Object*, ObjectPath> g_object_paths;

std::mutex g_trees_mutex;
std::map<std::string, std::shared_ptr<const ModuleTree>> g_trees;  // by the root's class name

// "__torch__.torch.nn.modules.container.ModuleList" -> "ModuleList", as the frames spell classes.
std::string bare_class(const std::string& qualified) { return qualified.substr(qualified.find_last_of('.') + 1); }

struct Frame {
  std::string name, type;
  bool function = false;  // a free function's frame: no module of its own
};

Frame parse_frame(const std::string& entry) {
  Frame f;
  if (entry.rfind("CALL_FUNCTION::", 0) == 0 || entry.rfind("::", 0) == 0) {
    f.function = true;
    return f;
  }
  const size_t open = entry.find('(');
  f.name = entry.substr(0, open);
  if (open != std::string::npos) {
    const size_t close = entry.find(')', open);
    f.type = entry.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
  }
  return f;
}

std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

// The module below `parent` whose last name is `name` (any name when empty)
// and whose class is `type` (any when empty): the shallowest such, so a direct
// child wins over a namesake deeper down; named_modules() order settles a tie
// (two containers under one called module holding the same class at the same
// index, which the frames cannot tell apart).
const std::string* find_below(const ModuleTree& tree, const std::string& parent, const std::string& name,
                              const std::string& type) {
  const std::string prefix = parent.empty() ? "" : parent + ".";
  const std::string* best = nullptr;
  size_t best_depth = 0;
  for (const auto& [path, cls] : tree.modules) {
    if (path.size() <= prefix.size() || path.compare(0, prefix.size(), prefix) != 0) continue;
    if (!type.empty() && cls != type) continue;
    const size_t dot = path.find_last_of('.');
    if (!name.empty() && path.compare(dot == std::string::npos ? 0 : dot + 1, std::string::npos, name) != 0) continue;
    const size_t depth = size_t(std::count(path.begin() + prefix.size(), path.end(), '.'));
    if (!best || depth < best_depth) {
      best = &path;
      best_depth = depth;
    }
  }
  return best;
}

}  // namespace

void register_torchscript_modules(const torch::jit::Module& model) {
  auto tree = std::make_shared<ModuleTree>();
  std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, std::string>> objects;
  for (const auto& m : model.named_modules()) {
    const auto type_name = m.value.type()->name();
    tree->modules.emplace_back(m.name, type_name ? bare_class(type_name->qualifiedName()) : "");
    objects.emplace_back(m.value._ivalue(), m.name);
  }
  const std::string root = tree->modules.empty() ? "" : tree->modules.front().second;
  std::lock_guard<std::mutex> lock(g_trees_mutex);
  g_trees[root] = std::move(tree);
  for (auto it = g_object_paths.begin(); it != g_object_paths.end();)
    it = it->second.object.expired() ? g_object_paths.erase(it) : std::next(it);
  for (auto& [object, path] : objects)
    g_object_paths.insert_or_assign(object.get(),
                                    ObjectPath{c10::weak_intrusive_ptr<c10::ivalue::Object>(object), path});
}

std::optional<std::string> registered_module_path(const c10::IValue& self) {
  if (!self.isObject()) return std::nullopt;
  const c10::ivalue::Object* object = &self.toObjectRef();
  std::lock_guard<std::mutex> lock(g_trees_mutex);
  auto it = g_object_paths.find(object);
  if (it == g_object_paths.end() || it->second.object.lock().get() != object) return std::nullopt;
  return it->second.path;
}

std::string dotted_module_path(const std::vector<std::string>& hierarchy) {
  if (hierarchy.empty()) return "";
  std::shared_ptr<const ModuleTree> tree;
  {
    std::lock_guard<std::mutex> lock(g_trees_mutex);
    if (auto it = g_trees.find(parse_frame(hierarchy.front()).type); it != g_trees.end()) tree = it->second;
  }
  std::string path;
  for (size_t i = 1; i < hierarchy.size(); ++i) {  // entry 0 is the top-level module
    const Frame f = parse_frame(hierarchy[i]);
    if (f.function || f.name.empty() || f.name == "SELF") continue;  // same module as its caller
    const bool unknown = f.name == "INSTANCE_NAME_UNKNOWN";          // reached through a local variable
    const std::string* found = tree ? find_below(*tree, path, unknown ? "" : f.name, f.type) : nullptr;
    if (found)
      path = *found;
    else if (!unknown)
      path = join(path, f.name);
  }
  return path;
}

std::string current_module_path() {
  const std::string& scoped = current_module_scope();
  if (!scoped.empty()) return scoped;
  // TorchScript models are attributed through the interpreter's call stack.
  return dotted_module_path(torch::jit::currentModuleHierarchy());
}

}  // namespace nanscope::probe
