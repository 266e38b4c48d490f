#pragma once
// How a log line names a list that may be long: the first few, then a count
// ("parameter a, parameter b, parameter c and 4 more").
#include <string>
#include <vector>

namespace nanscope {

std::string first_few_text(const std::vector<std::string>& items, size_t shown = 3);

}  // namespace nanscope
