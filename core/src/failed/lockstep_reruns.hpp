#pragma once
// --fallback auto on a sharded model (FSDP): its forward and backward are
// collectives, so the diagnosis's re-runs run on every rank together, as the
// forensic re-run does. One rank leads, the lowest that found the first
// birth (else the lowest whose own loss went non-finite, else rank 0): it chooses the
// remedy from its own micro-batch's re-runs (remedy.hpp's choose_remedy),
// announcing each re-run to the others first, and every rank re-runs its own
// micro-batch alongside, at the same precision and with the same modules in
// fp32 (a row is left out of the leader's alone). A re-run's verdict is every
// rank's: the sharded backward mixes every rank's gradients.
#include <string>
#include <vector>

#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/remedy.hpp"

namespace nanscope {

// `text` from rank `from`, on every rank, in one sum (every rank must know
// its `length`).
std::string text_from_rank(GradientAverager& ranks, int from, const std::string& text, int64_t length);
// The same where only `from` knows the length: two sums.
std::string text_from_rank(GradientAverager& ranks, int from, const std::string& text);
// Several texts as one, to pass from rank to rank, and back (`separator`
// must be a byte no text holds).
std::string joined(const std::vector<std::string>& texts, char separator);
std::vector<std::string> split_on(const std::string& text, char separator);

// The rank that leads a lockstep diagnosis, or -1 where none may (one sum, on
// every rank): the lowest of those with the highest `claim`. `claim` is this
// rank's, 0 where its decision needs no diagnosis (or it has nothing to
// diagnose), else higher the nearer it is to the fault.
int lockstep_leader(GradientAverager& ranks, int claim);

// The leader's re-runs: each one announced, then run by every rank.
class LockstepReruns : public StepReruns {
 public:
  LockstepReruns(GradientAverager& ranks, LiveStepReruns& mine) : ranks_(ranks), mine_(mine) {}
  bool finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row) override;
  std::vector<std::string> modules_seen() override;
  // The leader's own batch, read without a re-run.
  std::vector<int64_t> rows_out_of_range(const std::vector<int64_t>& rows) override {
    return mine_.rows_out_of_range(rows);
  }
  std::string ambiguous_rows() override { return mine_.ambiguous_rows(); }
  bool unswitchable() const override { return mine_.unswitchable(); }
  bool raised() const override { return mine_.raised(); }
  std::string last_error() const override { return mine_.last_error(); }
  bool draws_random_numbers() override;
  // Tells the others the diagnosis is over (they stop following).
  void finish();

 private:
  void announce(int op, Amp amp, int64_t without_row, const std::vector<std::string>& fp32_modules);

  GradientAverager& ranks_;
  LiveStepReruns& mine_;
};

// A rank that is not the leader: re-runs its own micro-batch as each
// announcement says, until the leader finishes.
void follow_lockstep_reruns(GradientAverager& ranks, int leader, LiveStepReruns& mine);

}  // namespace nanscope
