#pragma once
// One line for an exception from LibTorch, for logs, events and the CLI.
#include <exception>
#include <string>

namespace nanscope {

// c10::Error without its C++ backtrace; for an op that failed inside the
// TorchScript interpreter, its last line (the error itself) rather than the
// interpreter's traceback of the serialized code.
std::string one_line_error(const std::exception& e);

}  // namespace nanscope
