#include "failed/poisoned_samples.hpp"

#include <algorithm>

#include "nanscope/format/poison_list.hpp"

namespace nanscope {

std::vector<int64_t> list_poisoned_samples(const std::string& run_dir, int64_t step, int rank, const RecoveryPlan& plan,
                                           const std::optional<RemedyChoice>& mine, const RecoveryWords& words,
                                           const std::string& first_birth) {
  if (plan.action != RecoveryAction::skip_data || !mine || mine->no_say || mine->remedy != Remedy::skip_data ||
      mine->trigger_dataset_rows.empty())
    return {};
  const std::string path = format::poison_list_path(run_dir);
  std::vector<int64_t> listed_before;
  for (const format::PoisonedSample& s : format::read_poison_list(path)) listed_before.push_back(s.row);
  std::vector<int64_t> listed;
  for (int64_t row : mine->trigger_dataset_rows) {
    if (std::count(listed_before.begin(), listed_before.end(), row) || std::count(listed.begin(), listed.end(), row))
      continue;
    format::PoisonedSample sample;
    sample.row = row;
    sample.step = step;
    sample.rank = rank;
    sample.birth = first_birth.substr(0, first_birth.find('\n'));
    sample.why = words.why;
    format::append_poisoned_sample(path, sample);
    listed.push_back(row);
  }
  return listed;
}

}  // namespace nanscope
