#pragma once
// How nanscope writes a number into a log line, an event or a config value:
// the shortest default stream form ("0.5", "1e-05", "inf"), the same everywhere.
#include <string>

namespace nanscope {

std::string number_text(double value);

}  // namespace nanscope
