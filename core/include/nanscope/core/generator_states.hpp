#pragma once
// The random generators a training loop draws from: the CPU's default one and
// each CUDA device's. The guard's own re-runs (forensics, remedies, the doom
// search) set them to replay a step's dropout masks; a loop must find them
// where it left them afterwards, or its next batches and masks differ from
// the plain loop's for good (nanoGPT's get_batch draws from the CPU one).
#include <ATen/ATen.h>

#include <vector>

namespace nanscope {

struct GeneratorStates {
  at::Tensor cpu;
  std::vector<at::Tensor> cuda;  // by device index; empty without CUDA

  // Where the generators are now. Cheap enough for a failing step (a ~5 KB
  // copy for the CPU one), not meant for every clean step.
  static GeneratorStates now();
  void restore() const;
};

// Puts the generators back as they were at construction when it goes out of
// scope, however the scope is left (a DeadRunError, a model's exception),
// unless keep_as_is() says the scope's own setting is the one to keep (a
// rollback deliberately goes back to a saved state's generators).
class KeepGeneratorStates {
 public:
  KeepGeneratorStates() : states_(GeneratorStates::now()) {}
  ~KeepGeneratorStates();
  KeepGeneratorStates(const KeepGeneratorStates&) = delete;
  KeepGeneratorStates& operator=(const KeepGeneratorStates&) = delete;
  void keep_as_is() { armed_ = false; }

 private:
  GeneratorStates states_;
  bool armed_ = true;
};

}  // namespace nanscope
