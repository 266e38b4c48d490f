#pragma once
// Forensics: a failed step re-run under op-level capture to name where its
// first NaN/Inf was born, the snapshot that lets nanscope-replay run it
// again, and --fallback auto's diagnosis from re-runs of it. It works over
// the steered model, the probe and the journal, and keeps what it learns
// between steps in its memory (ForensicsMemory); each call reads the failed
// step (read only) and returns what it found as a value. Private to core.
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "failed/failed_step_values.hpp"
#include "guard/running_step.hpp"
#include "guard/steered.hpp"
#include "nanscope/core/forensics_memory.hpp"
#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/guard_options.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/recovery_memory.hpp"
#include "nanscope/core/remedy.hpp"
#include "nanscope/core/snapshot_policy.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/probe.hpp"

namespace nanscope {

class Forensics {
 public:
  // `recovered`: what recovery has put in place (fp32 modules, pinned
  // kernels, failed steps in a row), which re-runs run with.
  Forensics(Steered& steered, const std::vector<at::Tensor>& parameters, probe::Probe& probe, Journal& journal,
            ForensicsMemory& memory, const RecoveryMemory& recovered, const GuardOptions& options);

  // The failed step investigated: weights that already held the NaN/Inf as
  // it began (named in place of a re-run), else a batch that holds it, else
  // a re-run under capture (at a closure optimizer's failed evaluation). Its
  // first birth is recorded and its snapshot written; on several replicated
  // ranks the first sick rank's birth is told to every rank. A step whose
  // model raised before any birth throws ModelError with `model_exception`.
  ForensicFindings investigate(const RunningStep& run, const std::vector<float>& layer_grad_norm,
                               std::exception_ptr model_exception);
  // --fallback auto's diagnosis of the failed step from re-runs of it (at a
  // closure optimizer's failed evaluation, as investigate; a sharded model's
  // on every rank together, `needed` or not there: the others follow the
  // rank that leads).
  RemedyChoice diagnose(const RunningStep& run, const std::optional<format::Capture>& capture);
  RemedyChoice diagnose_in_lockstep(const RunningStep& run, const std::optional<format::Capture>& capture, bool needed);
  // The micro-batch a diagnosis re-runs: the one of the first birth.
  size_t diagnosed_micro_batch(const RunningStep& run, const std::optional<format::Capture>& capture) const;

 private:
  // A sharded model's forensics in lockstep: the ranks that found a birth,
  // this rank's snapshot decision, and the whole parameters it writes.
  struct RanksBorn {
    std::vector<int> births;
    std::optional<SnapshotPolicy::Decision> decision;  // this rank found a birth
    NamedTensors gathered;                             // this rank writes the snapshot
    std::string birth;                                 // the first rank's birth, as it says it
  };

  ForensicFindings investigate_at_trial_point(const RunningStep& run, const std::vector<std::string>& nonfinite_weights,
                                              const std::vector<float>& layer_grad_norm,
                                              std::exception_ptr model_exception);
  bool investigates(const RunningStep& run, bool birth_known) const;  // re-run, or its input or weights hold the birth
  void keep_skipped_inputs(int64_t step, const std::vector<Batch>& batches);
  format::Capture rerun_under_capture(const RunningStep& run, const std::vector<Batch>& batches,
                                      std::string& compiled_cost);
  std::string check_compiled_step(const RunningStep& run, format::Capture& capture, bool eager_clean);
  // Another rank's birth, as that rank says it: "nan at ... , batch row 2, on
  // rank 1; born on rank(s) 1, not on rank 0 (run-rank-1.h5 has the rest)"
  // ("none on rank 0: born on ..." where that rank's text is empty).
  std::string born_elsewhere(const std::vector<int>& births, const std::string& birth) const;
  std::string birth_from_rank(GradientAverager& ranks, const std::vector<int>& births, const std::string& mine) const;
  // This rank's first birth line once the ranks have told theirs.
  std::string told_across_ranks(const RunningStep& run, const std::string& first_birth);
  RanksBorn agree_on_births(GradientAverager& ranks, const std::optional<format::Capture>& capture,
                            const RunningStep& run);
  SnapshotPolicy::Decision snapshot_decision(const RunningStep& run, const format::Capture& capture,
                                             const std::optional<RanksBorn>& born, bool written_outside);
  std::string first_birth_text(const RunningStep& run, const format::Capture& capture,
                               const std::optional<RanksBorn>& born, bool written_outside) const;
  std::string keep_snapshot(const RunningStep& run, const std::optional<format::Capture>& capture,
                            std::optional<RanksBorn>& born, const std::vector<float>& layer_grad_norm,
                            bool written_outside);
  std::string write_snapshot(const RunningStep& run, size_t micro, const std::vector<float>& layer_grad_norm,
                             const format::Capture& capture, NamedTensors parameters);
  void say_carried_state(int64_t step, const std::vector<Batch>& micro_batches);
  // A micro-batch the loop changed in place after its model call (the first
  // with a non-finite loss, else the first), or -1.
  int64_t changed_micro_batch(const RunningStep& run) const;
  std::string changed_micro_batch_text(const RunningStep& run) const;  // " the loop changed micro-batch K ..."
  // With `lockstep`, a sharded model's diagnosis, led by `leader`
  // (lockstep_reruns.hpp): no say on every other rank.
  RemedyChoice diagnose_led(const RunningStep& run, const std::optional<format::Capture>& capture,
                            GradientAverager* lockstep, int leader);

  Steered& steered_;
  const std::vector<at::Tensor>& parameters_;
  probe::Probe& probe_;
  Journal& journal_;
  ForensicsMemory& memory_;
  const RecoveryMemory& recovered_;
  const GuardOptions& options_;
  std::vector<Batch> skipped_inputs_;  // the input of the last step skipped for its own NaN/Inf (say_carried_state)
};

}  // namespace nanscope
