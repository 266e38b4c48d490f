#pragma once
// A `data` diagnosis's samples into the run's poison list
// (format/poison_list.hpp), so later epochs, a resumed run and every rank
// leave them out. Private to the guard's files.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/recovery.hpp"
#include "nanscope/core/recovery_words.hpp"

namespace nanscope {

// The data set rows a `data` skip blames, listed: where the plan carried
// out is that skip and this rank's own fresh diagnosis (`mine`: none for a
// repeat of an earlier step's fault, or on a rank whose batch was finite)
// named rows the loop gave, each row once (a row already listed is not
// listed again). Returns the rows it listed. `rank`: -1 for one process.
// Throws format::WriteError.
std::vector<int64_t> list_poisoned_samples(const std::string& run_dir, int64_t step, int rank, const RecoveryPlan& plan,
                                           const std::optional<RemedyChoice>& mine, const RecoveryWords& words,
                                           const std::string& first_birth);

}  // namespace nanscope
