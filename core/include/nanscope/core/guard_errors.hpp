#pragma once
// What a step guard throws at its caller, without LibTorch: a program that
// only catches them (nanscope-train's main) need not parse LibTorch's headers.
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace nanscope {

// The weights went non-finite and nothing can bring them back (no rollback
// left), or trouble outlasted every rollback and the fp32 fallback: the run
// is dead. Its message says which; run.h5 is whole.
class DeadRunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The model raised in a step and no NaN/Inf birth before it explains it: an
// error in the model (or the closure). `what()` says which step; `original`
// is the exception as the model threw it (the Python module rethrows that).
class ModelError : public std::runtime_error {
 public:
  ModelError(const std::string& what, std::exception_ptr original)
      : std::runtime_error(what), original(std::move(original)) {}
  std::exception_ptr original;
};

}  // namespace nanscope
