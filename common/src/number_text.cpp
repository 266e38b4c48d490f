#include "nanscope/common/number_text.hpp"

#include <sstream>

namespace nanscope {

std::string number_text(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

}  // namespace nanscope
