#include "nanscope/format/layer_rows_fetch.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "h5.hpp"
#include "nanscope/format/error.hpp"
#include "overview_columns.hpp"
#include "rehearsal.hpp"

namespace nanscope::format {

namespace {

// What the child leaves at the start of the shared memory, before the rows.
struct SharedHeader {
  int64_t done = 0;  // 1 once every row is in place
  char error[512] = {};
};

RunData read_rows(const std::string& path, size_t from, size_t to, size_t layers, bool grad, bool act) {
  const h5::Handle file = h5::open_file_readonly(path);
  h5::check_identity(file.get(), kRunFileKind, path);
  const hsize_t committed = committed_rows(file.get(), grad, act, path);
  if (to > committed)
    throw FormatError(
        path, "holds " + std::to_string(committed) + " rows, not the " + std::to_string(to) + " the view asked for");
  return read_step_rows(file.get(), from, to, layers, grad, act, path);
}

}  // namespace

struct LayerRowsFetch::Impl {
  std::string path;
  size_t from = 0, rows = 0, layers = 0;
  bool grad = false, act = false;
  void* shared = MAP_FAILED;
  size_t shared_bytes = 0;
  std::optional<h5::ChildRead> child;
  std::optional<LayerRows> here;  // read in this process (rehearsal off, or no child to spare)

  size_t table_values() const { return rows * layers; }
  SharedHeader* header() const { return static_cast<SharedHeader*>(shared); }
  int64_t* steps() const { return reinterpret_cast<int64_t*>(static_cast<char*>(shared) + sizeof(SharedHeader)); }
  float* grad_values() const { return reinterpret_cast<float*>(steps() + rows); }
  float* act_values() const { return grad_values() + (grad ? table_values() : 0); }

  LayerRows from_run(const RunData& run) const {
    LayerRows out;
    out.from = from;
    out.layers = layers;
    out.step = run.step;
    out.grad_norm = run.layer_grad_norm;
    out.act_absmax = run.layer_act_absmax;
    return out;
  }

  // In the child: the rows into shared memory, or the error's words.
  void read_into_shared() const {
    try {
      const RunData run = read_rows(path, from, from + rows, layers, grad, act);
      std::copy(run.step.begin(), run.step.end(), steps());
      if (grad) std::copy(run.layer_grad_norm.begin(), run.layer_grad_norm.end(), grad_values());
      if (act) std::copy(run.layer_act_absmax.begin(), run.layer_act_absmax.end(), act_values());
      header()->done = 1;
    } catch (const std::exception& e) {
      std::strncpy(header()->error, e.what(), sizeof header()->error - 1);
      throw;
    }
  }
};

LayerRowsFetch::LayerRowsFetch(const std::string& path, size_t from, size_t to, size_t layers, bool grad, bool act)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.from = from;
  m.rows = to > from ? to - from : 0;
  m.layers = layers;
  m.grad = grad && layers > 0;
  m.act = act && layers > 0;
  if (!h5::rehearsal_needed()) {
    m.here = m.from_run(read_rows(path, from, from + m.rows, layers, m.grad, m.act));
    return;
  }
  m.shared_bytes = sizeof(SharedHeader) + m.rows * sizeof(int64_t) +
                   (size_t(m.grad) + size_t(m.act)) * m.table_values() * sizeof(float);
  m.shared = mmap(nullptr, m.shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m.shared == MAP_FAILED) throw FormatError(path, "no memory for " + std::to_string(m.rows) + " rows");
  new (m.shared) SharedHeader();
  m.child.emplace(path, [&m] { m.read_into_shared(); });
  if (!m.child->started()) {  // no process to spare: read here
    m.child.reset();
    m.here = m.from_run(read_rows(path, from, from + m.rows, layers, m.grad, m.act));
  }
}

LayerRowsFetch::~LayerRowsFetch() {
  impl_->child.reset();  // stops it before its memory goes
  if (impl_->shared != MAP_FAILED) munmap(impl_->shared, impl_->shared_bytes);
}

bool LayerRowsFetch::ready() {
  Impl& m = *impl_;
  if (m.here || !m.child) return true;
  if (!m.child->poll()) return false;
  m.child.reset();
  if (m.header()->done != 1) {
    std::string words(m.header()->error, strnlen(m.header()->error, sizeof m.header()->error));
    const std::string named = "'" + m.path + "': ";  // a FormatError's words name the file already
    if (words.rfind(named, 0) == 0) words.erase(0, named.size());
    throw FormatError(m.path, words.empty() ? "rows " + std::to_string(m.from) + ".." +
                                                  std::to_string(m.from + m.rows) + " could not be read"
                                            : words);
  }
  LayerRows out;
  out.from = m.from;
  out.layers = m.layers;
  out.step.assign(m.steps(), m.steps() + m.rows);
  if (m.grad) out.grad_norm.assign(m.grad_values(), m.grad_values() + m.table_values());
  if (m.act) out.act_absmax.assign(m.act_values(), m.act_values() + m.table_values());
  m.here = std::move(out);
  return true;
}

LayerRows LayerRowsFetch::take() {
  if (!ready()) throw std::logic_error("LayerRowsFetch::take before ready()");
  LayerRows out = std::move(*impl_->here);
  impl_->here.reset();
  return out;
}

}  // namespace nanscope::format
