#pragma once
// Names and widths of run.h5's objects, shared by its writer and reader.
#include <cstddef>

namespace nanscope::format::run_schema {

inline constexpr const char* kStepsGroup = "/steps";
inline constexpr const char* kLayersGroup = "/layers";
inline constexpr const char* kEventsGroup = "/events";
inline constexpr const char* kConfigGroup = "/config";
inline constexpr size_t kEventKindWidth = 16;
inline constexpr size_t kEventTextWidth = 240;

}  // namespace nanscope::format::run_schema
