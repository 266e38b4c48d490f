#pragma once
// A step's forward and loss as the loop writes them, for the guard to call
// (and call again: the forensic re-run, the diagnosis, replay).
#include <functional>

#include "nanscope/probe/batch.hpp"

namespace nanscope {

using LossClosure = std::function<at::Tensor()>;                  // forward + loss on the step's batch
using BatchLoss = std::function<at::Tensor(const Batch& batch)>;  // forward + loss on any batch

}  // namespace nanscope
