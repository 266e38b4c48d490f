#pragma once
// The words of --fallback and --fp32-modules, without LibTorch: the command
// line parses them beside the LibTorch batches.
#include <string>
#include <vector>

namespace nanscope {

// What a non-finite step triggers (--fallback): nothing but the skip (off),
// the stock whole-model fp32 fallback with its LR cut (whole), or the remedy
// the step's own diagnosis supports (automatic: --fallback auto, remedy.hpp).
enum class FallbackMode { off, whole, automatic };
const char* fallback_mode_name(FallbackMode mode);  // "off", "whole", "auto"

// "a.b,c": the spelling of --fp32-modules.
std::string fp32_modules_flag_value(const std::vector<std::string>& modules);
// Splits --fp32-modules' value; empty names and repeats are dropped.
std::vector<std::string> parse_fp32_modules(const std::string& text);

}  // namespace nanscope
