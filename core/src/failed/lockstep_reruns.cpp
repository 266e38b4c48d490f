#include "failed/lockstep_reruns.hpp"

#include "nanscope/probe/op_capture.hpp"

namespace nanscope {

namespace {

// An announcement: what every rank re-runs next.
enum Op : int { kDone = 0, kFinite = 1, kModulesSeen = 2 };
constexpr char kModuleSeparator = '\x1e';

struct Announcement {
  int op = kDone;
  Amp amp = Amp::fp32;
  int64_t without_row = -1;
  std::vector<std::string> fp32_modules;
};

// One sum to which only `leader` adds (op, precision, row, the modules' text
// length), then the modules' names where there are any.
Announcement announced(GradientAverager& ranks, int leader, const Announcement& mine) {
  const std::string modules = joined(mine.fp32_modules, kModuleSeparator);
  at::Tensor head = at::zeros({4}, at::kDouble);
  if (ranks.rank() == leader) {
    double* h = head.data_ptr<double>();
    h[0] = mine.op;
    h[1] = double(mine.amp);
    h[2] = double(mine.without_row);
    h[3] = double(modules.size());
  }
  ranks.sum(head);
  const double* h = head.data_ptr<double>();
  Announcement out;
  out.op = int(h[0]);
  out.amp = Amp(int(h[1]));
  out.without_row = int64_t(h[2]);
  if (h[3] > 0) {
    out.fp32_modules = split_on(text_from_rank(ranks, leader, modules, int64_t(h[3])), kModuleSeparator);
  }
  return out;
}

// Every rank's re-run finite (one sum).
bool finite_on_every_rank(GradientAverager& ranks, bool mine) { return ranks.every_rank(mine); }

}  // namespace

std::string text_from_rank(GradientAverager& ranks, int from, const std::string& text, int64_t length) {
  at::Tensor bytes = at::zeros({length}, at::kFloat);
  if (ranks.rank() == from) {
    float* b = bytes.data_ptr<float>();
    for (int64_t i = 0; i < length && size_t(i) < text.size(); ++i) b[i] = float(static_cast<unsigned char>(text[i]));
  }
  ranks.sum(bytes);
  std::string out(size_t(length), '\0');
  const float* b = bytes.data_ptr<float>();
  for (int64_t i = 0; i < length; ++i) out[size_t(i)] = char(static_cast<unsigned char>(b[i]));
  return out;
}

std::string text_from_rank(GradientAverager& ranks, int from, const std::string& text) {
  at::Tensor length = at::zeros({1}, at::kDouble);
  if (ranks.rank() == from) length.fill_(double(text.size()));
  ranks.sum(length);
  const int64_t n = int64_t(length.item<double>());
  return n > 0 ? text_from_rank(ranks, from, text, n) : std::string();
}

std::string joined(const std::vector<std::string>& texts, char separator) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) out += (i ? std::string(1, separator) : std::string()) + texts[i];
  return out;
}

std::vector<std::string> split_on(const std::string& text, char separator) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == separator)
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

int lockstep_leader(GradientAverager& ranks, int claim) {
  const int world = ranks.world_size();
  at::Tensor claims = at::zeros({world}, at::kFloat);
  claims.data_ptr<float>()[ranks.rank()] = float(claim);
  ranks.sum(claims);
  const float* c = claims.data_ptr<float>();
  int leader = -1;
  for (int r = 0; r < world; ++r)
    if (c[r] > 0 && (leader < 0 || c[r] > c[leader])) leader = r;
  return leader;
}

void LockstepReruns::announce(int op, Amp amp, int64_t without_row, const std::vector<std::string>& fp32_modules) {
  Announcement a;
  a.op = op;
  a.amp = amp;
  a.without_row = without_row;
  a.fp32_modules = fp32_modules;
  announced(ranks_, ranks_.rank(), a);
}

bool LockstepReruns::finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row) {
  announce(kFinite, amp, without_row, fp32_modules);
  return finite_on_every_rank(ranks_, mine_.finite(amp, fp32_modules, without_row));
}

std::vector<std::string> LockstepReruns::modules_seen() {
  announce(kModulesSeen, Amp::fp32, -1, {});
  return mine_.modules_seen();
}

bool LockstepReruns::draws_random_numbers() {
  // Known from a whole-batch re-run: the one it takes runs on every rank.
  if (!mine_.draws_known()) finite(Amp::fp32, {}, -1);
  return mine_.draws_random_numbers();
}

void LockstepReruns::finish() { announce(kDone, Amp::fp32, -1, {}); }

void follow_lockstep_reruns(GradientAverager& ranks, int leader, LiveStepReruns& mine) {
  for (;;) {
    const Announcement a = announced(ranks, leader, Announcement{});
    if (a.op == kDone) return;
    // The same re-run on this rank's own micro-batch, every row of it.
    const bool finite = mine.finite(a.amp, a.fp32_modules, -1);
    if (a.op == kFinite) finite_on_every_rank(ranks, finite);
  }
}

}  // namespace nanscope
