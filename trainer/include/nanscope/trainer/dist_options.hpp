#pragma once
// How a multi-process run is launched and checked: plain values, no LibTorch,
// so the command line and its validation compile without it (distributed.hpp
// holds the process group itself).
#include <stdexcept>
#include <string>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

// --dist-backend: auto is NCCL for CUDA where it is built, else Gloo.
#define NANSCOPE_DIST_BACKENDS(X) X(automatic, "auto") X(gloo, "gloo") X(nccl, "nccl")
NANSCOPE_DECLARE_WORDS_IN(format::Words, DistBackend, NANSCOPE_DIST_BACKENDS)

}  // namespace nanscope

namespace nanscope::trainer {

struct DistOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  DistBackend backend = DistBackend::automatic;
  double timeout_s = 300;  // a collective (or the rendezvous) waiting longer fails the run
  double bucket_mb = 25;   // gradient all-reduce bucket size, as DDP's bucket_cap_mb
  bool enabled() const { return world_size > 1; }
};

// A collective failed: a peer died, or did not answer within the timeout.
// Every rank that sees it ends with this error instead of hanging.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// True when this build can run multi-process (c10d Gloo headers were found).
bool distributed_available();
// Checks rank/world/port; throws std::invalid_argument naming the bad value.
void validate(const DistOptions& options);

}  // namespace nanscope::trainer
