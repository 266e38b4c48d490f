#pragma once
// How nanscope writes a number into a log line, an event or a config value:
// the shortest default stream form ("0.5", "1e-05", "inf"), the same everywhere.
#include <string>

namespace nanscope {

std::string number_text(double value);
// A duration as logs and events say it: two significant digits ("0.51 s", "12 s").
std::string seconds_text(double seconds);

}  // namespace nanscope
