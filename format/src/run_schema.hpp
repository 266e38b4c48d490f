#pragma once
// Names and widths of run.h5's objects, shared by its writer and reader.
#include <cstddef>

namespace nanscope::format::run_schema {

inline constexpr const char* kStepsGroup = "/steps";
inline constexpr const char* kLayersGroup = "/layers";
inline constexpr const char* kEventsGroup = "/events";
inline constexpr const char* kConfigGroup = "/config";
// /steps' one-value-per-step columns; the per-layer ones are layer_grad_norm
// and layer_act_absmax (steps x layers), present when the run recorded layers.
inline constexpr const char* kScalarStepColumns[] = {"step",      "loss",    "lr",  "loss_scale",
                                                     "grad_norm", "skipped", "amp", "step_time"};
inline constexpr size_t kEventKindWidth = 16;
inline constexpr size_t kEventTextWidth = 240;

}  // namespace nanscope::format::run_schema
