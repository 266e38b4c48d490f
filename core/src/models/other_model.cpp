#include "nanscope/core/other_model.hpp"

#include <stdexcept>

namespace nanscope {

void add_other_model(TrainableModel& model, const OtherModel& other) {
  if (!other.module) throw std::invalid_argument("other model '" + other.label + "': no module (an empty holder?)");
  NamedTensors parameters, buffers;
  for (const auto& item : other.module->named_parameters(/*recurse=*/true))
    parameters.emplace_back(item.key(), item.value());
  for (const auto& item : other.module->named_buffers(/*recurse=*/true)) buffers.emplace_back(item.key(), item.value());
  // The guarded model itself, given again, would be put back and named twice.
  const NamedTensors own = model.all_named_parameters();
  for (const auto& [name, t] : parameters)
    for (const auto& [own_name, own_t] : own)
      if (t.unsafeGetTensorImpl() == own_t.unsafeGetTensorImpl())
        throw std::invalid_argument("other model '" + other.label + "' shares parameter '" + own_name +
                                    "' with the guarded model: give only models the guard does not train");
  model.add_other_model(other.label, parameters, buffers);
}

}  // namespace nanscope
