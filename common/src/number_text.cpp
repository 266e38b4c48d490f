#include "nanscope/common/number_text.hpp"

#include <sstream>

namespace nanscope {

std::string number_text(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

std::string seconds_text(double seconds) {
  std::ostringstream s;
  s.precision(2);
  s << seconds << " s";
  return s.str();
}

}  // namespace nanscope
