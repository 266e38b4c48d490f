#include "nanscope/models/fault_host.hpp"

namespace nanscope {

bool plant_fault(TrainableModel& model, const Fault& fault) {
  if (auto* host = dynamic_cast<FaultHost*>(&model)) return host->plant_fault(fault);
  return fault.kind == FaultKind::none;
}

StepSetup planting(TrainableModel& model, const Fault& fault) {
  if (fault.kind == FaultKind::none) return {};
  return [&model, fault](bool in_step) { plant_fault(model, in_step ? fault : Fault{}); };
}

}  // namespace nanscope
