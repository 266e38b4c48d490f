#include "failed/plan_values.hpp"

#include <stdexcept>
#include <vector>

#include "nanscope/format/kernel_trials.hpp"

namespace nanscope {

namespace {

// The row's slots.
enum Slot : int {
  kStrength,
  kAction,
  kReason,
  kRemedy,
  kCounted,
  kThenStop,
  kKernel,
  kTextsLength,
  kAmp,
  kSameBirthStep,
  kHasDiagnosis,
  kDiagnosisRemedy,
  kDiagnosisKernel,
  kSecondsBefore,
  kSecondsAfter,
  kHasSameAs,
  kSameAsRemedy,
  kSameAsKernel,
};
static_assert(kSameAsKernel + 1 == kPlanNumbers, "a slot per number");

class TextsOut {
 public:
  void text(const std::string& s) { out_ += std::to_string(s.size()) + ':' + s; }
  void list(const std::vector<std::string>& items) {
    text(std::to_string(items.size()));
    for (const std::string& item : items) text(item);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class TextsIn {
 public:
  explicit TextsIn(const std::string& in) : in_(in) {}
  std::string text() {
    const size_t colon = in_.find(':', at_);
    if (colon == std::string::npos) throw std::runtime_error("a rank's plan arrived cut short");
    const size_t n = std::stoul(in_.substr(at_, colon - at_));
    if (colon + 1 + n > in_.size()) throw std::runtime_error("a rank's plan arrived cut short");
    std::string out = in_.substr(colon + 1, n);
    at_ = colon + 1 + n;
    return out;
  }
  std::vector<std::string> list() {
    std::vector<std::string> items(std::stoul(text()));
    for (std::string& item : items) item = text();
    return items;
  }

 private:
  const std::string& in_;
  size_t at_ = 0;
};

}  // namespace

void write_plan_numbers(const PlanValues& v, size_t texts_length, double* row) {
  const RecoveryPlan& plan = v.plan;
  row[kStrength] = plan_strength(plan);
  row[kAction] = double(plan.action);
  row[kReason] = double(plan.reason);
  row[kRemedy] = double(plan.remedy);
  row[kCounted] = plan.counted ? 1 : 0;
  row[kThenStop] = plan.then_stop ? 1 : 0;
  row[kKernel] = double(plan.kernel);
  row[kTextsLength] = double(texts_length);
  row[kAmp] = double(v.facts.amp);
  row[kSameBirthStep] = double(v.facts.same_birth_step);
  row[kHasDiagnosis] = plan.diagnosis ? 1 : 0;
  if (plan.diagnosis) {
    row[kDiagnosisRemedy] = double(plan.diagnosis->remedy);
    row[kDiagnosisKernel] = double(plan.diagnosis->kernel);
    row[kSecondsBefore] = plan.diagnosis->seconds_before;
    row[kSecondsAfter] = plan.diagnosis->seconds_after;
  }
  row[kHasSameAs] = v.facts.same_birth_as ? 1 : 0;
  if (v.facts.same_birth_as) {
    row[kSameAsRemedy] = double(v.facts.same_birth_as->remedy);
    row[kSameAsKernel] = double(v.facts.same_birth_as->kernel);
  }
}

size_t texts_length_of(const double* row) { return size_t(row[kTextsLength]); }

std::string plan_texts(const PlanValues& v) {
  TextsOut out;
  out.text(v.facts.what);
  out.text(v.facts.broken_state);
  out.text(v.facts.birth_where);
  out.text(v.facts.own_16bit);
  out.list(v.plan.modules);
  const RemedyChoice none;
  const RemedyChoice& diagnosis = v.plan.diagnosis ? *v.plan.diagnosis : none;
  out.text(diagnosis.why);
  out.list(diagnosis.modules);
  out.text(diagnosis.kernel_trials ? diagnosis.kernel_trials->op : "");
  out.text(diagnosis.kernel_trials ? format::kernel_trials_value(*diagnosis.kernel_trials) : "");
  out.list(v.facts.same_birth_as ? v.facts.same_birth_as->modules : std::vector<std::string>{});
  return out.take();
}

PlanValues plan_values_from(const double* row, const std::string& texts) {
  PlanValues v;
  RecoveryPlan& plan = v.plan;
  plan.action = RecoveryAction(int(row[kAction]));
  plan.reason = RecoveryReason(int(row[kReason]));
  plan.remedy = Remedy(int(row[kRemedy]));
  plan.counted = row[kCounted] != 0;
  plan.then_stop = row[kThenStop] != 0;
  plan.kernel = format::Kernel(int(row[kKernel]));
  v.facts.amp = Amp(int(row[kAmp]));
  v.facts.same_birth_step = int64_t(row[kSameBirthStep]);
  TextsIn in(texts);
  v.facts.what = in.text();
  v.facts.broken_state = in.text();
  v.facts.birth_where = in.text();
  v.facts.own_16bit = in.text();
  plan.modules = in.list();
  RemedyChoice diagnosis;
  diagnosis.why = in.text();
  diagnosis.modules = in.list();
  const std::string trials_op = in.text(), trials = in.text();
  if (!trials_op.empty()) diagnosis.kernel_trials = format::parse_kernel_trials(trials_op, trials);
  const std::vector<std::string> same_as_modules = in.list();
  if (row[kHasDiagnosis] != 0) {
    diagnosis.remedy = Remedy(int(row[kDiagnosisRemedy]));
    diagnosis.kernel = format::Kernel(int(row[kDiagnosisKernel]));
    diagnosis.seconds_before = row[kSecondsBefore];
    diagnosis.seconds_after = row[kSecondsAfter];
    plan.diagnosis = std::move(diagnosis);
  }
  if (row[kHasSameAs] != 0) {
    RemedyChoice same_as;
    same_as.remedy = Remedy(int(row[kSameAsRemedy]));
    same_as.kernel = format::Kernel(int(row[kSameAsKernel]));
    same_as.modules = same_as_modules;
    v.facts.same_birth_as = std::move(same_as);
  }
  return v;
}

}  // namespace nanscope
