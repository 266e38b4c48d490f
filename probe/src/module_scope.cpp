#include "nanscope/probe/module_scope.hpp"

#include <vector>

namespace nanscope::probe {

namespace detail {

std::atomic<bool> g_scopes_enabled{false};

namespace {
// Full dotted paths, innermost last. Autograd worker threads have their own
// (empty) stack: backward ops are attributed through seqNr instead.
thread_local std::vector<std::string> t_scopes;
}  // namespace

void push_scope(const char* name) {
  if (t_scopes.empty() || t_scopes.back().empty()) t_scopes.emplace_back(name);
  else t_scopes.push_back(t_scopes.back() + "." + name);
}

void pop_scope() {
  if (!t_scopes.empty()) t_scopes.pop_back();
}

}  // namespace detail

namespace {
thread_local const char* t_phase = nullptr;
}  // namespace

PhaseScope::PhaseScope(const char* phase) : previous_(t_phase) { t_phase = phase; }
PhaseScope::~PhaseScope() { t_phase = previous_; }
const char* current_phase_override() { return t_phase; }

const std::string& current_module_scope() {
  static const std::string root;
  return detail::t_scopes.empty() ? root : detail::t_scopes.back();
}

}  // namespace nanscope::probe
