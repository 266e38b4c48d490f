#pragma once
// Data parallelism over c10d (torch.distributed's C++ core): the process
// group a multi-process nanscope-train runs on, and the few collectives the
// training loop needs. c10d's types stay in distributed.cpp; what differs
// between LibTorch versions is wrapped there, once.
//
// Launch conventions are torchrun's: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT (or the same as flags). Rank 0 hosts the TCPStore rendezvous.
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "nanscope/trainer/dist_options.hpp"

namespace nanscope::trainer {

class ProcessGroup {
 public:
  // Rendezvous through the TCPStore at MASTER_ADDR:MASTER_PORT and build the
  // group. Throws DistributedError when the peers do not all arrive in time.
  static std::unique_ptr<ProcessGroup> connect(const DistOptions& options, at::Device device);
  ~ProcessGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& backend() const { return backend_; }

  // Sums each tensor across ranks in place: one collective per tensor, all in
  // flight together, then waits for all (the way a list of gradient buckets is reduced).
  void all_reduce(const std::vector<at::Tensor>& tensors);
  // Rank 0's values into every rank's tensors (in place).
  void broadcast(const std::vector<at::Tensor>& tensors);
  void barrier();

  // What the next collective is for, so a failure names it ("step 41: gradient all-reduce").
  void set_context(std::string context) { context_ = std::move(context); }

  // Collectives issued so far (one per tensor reduced or broadcast, one per
  // barrier): what a step costs in rounds, which the summary reports.
  int64_t collectives_issued() const { return issued_; }

 private:
  struct Impl;
  ProcessGroup(std::unique_ptr<Impl> impl, int rank, int world_size, std::string backend);
  [[noreturn]] void fail(const char* what, const std::exception& e) const;

  std::unique_ptr<Impl> impl_;
  int rank_, world_size_;
  std::string backend_;
  std::string context_;
  int64_t issued_ = 0;
};

}  // namespace nanscope::trainer
