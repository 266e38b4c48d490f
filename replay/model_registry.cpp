#include "nanscope/replay/model_registry.hpp"

#include <map>
#include <mutex>

namespace nanscope::replay {

namespace {
std::mutex g_mutex;
std::map<std::string, ModelFactory>& factories() {
  static std::map<std::string, ModelFactory> f;
  return f;
}
}  // namespace

void register_model(const std::string& name, ModelFactory factory) {
  std::lock_guard<std::mutex> lock(g_mutex);
  factories()[name] = std::move(factory);
}

ModelFactory registered_model(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = factories().find(name);
  return it == factories().end() ? ModelFactory{} : it->second;
}

}  // namespace nanscope::replay
