#include "nanscope/format/capture.hpp"

#include "nanscope/common/list_text.hpp"

namespace nanscope::format {

std::string birth_text(const Birth& b) {
  std::string text = std::string(to_string(b.kind)) + " at " + b.op.op +
                     (b.op.phase == Phase::input && !b.input.empty() ? " '" + b.input + "'" : std::string()) + " (" +
                     to_string(b.op.phase);
  if (!b.op.backward_node.empty())
    text += (b.op.site == OpSite::gradient_hook ? ", in a gradient hook at " : ", in ") + b.op.backward_node +
            (b.op.forward_op.empty() ? std::string() : " of " + b.op.forward_op);
  if (b.op.site == OpSite::recomputation) text += ", recomputed";
  text += ") in module '" + b.op.module + "'";
  const std::string place = birth_place_text(b);
  return place.empty() ? text : text + ", " + place;
}

std::string birth_place_text(const Birth& b) {
  std::string text;
  auto add = [&](const std::string& part) { text += (text.empty() ? "" : ", ") + part; };
  if (b.micro_batch >= 0) add("micro-batch " + std::to_string(b.micro_batch));
  if (b.sample >= 0) {
    add("batch row " + std::to_string(b.sample));
  } else if (!b.rows.empty()) {  // an internal birth that went non-finite in these rows only
    std::string rows = b.rows.size() == 1 ? "batch row " : "batch rows ";
    for (size_t i = 0; i < b.rows.size(); ++i) rows += (i ? ", " : "") + std::to_string(b.rows[i]);
    add(rows);
  }
  return text;
}

std::string weights_text(const std::vector<std::string>& names) {
  std::vector<std::string> items;
  for (const std::string& name : names) items.push_back("parameter " + name);
  return first_few_text(items);
}

std::string capture_text(const Capture& c) {
  if (!c.nonfinite_weights.empty())
    return "born before this step: its weights held NaN/Inf as it began (" + weights_text(c.nonfinite_weights) +
           "), made so by an earlier update or loaded so; no op of this step is the birth";
  if (c.ops_seen < 0) return "the forensic re-run failed";
  if (c.compiled_only)
    return "finite when run eagerly, non-finite compiled: the compiled program, not the model's math" +
           (!c.compiled_region ? std::string()
            : c.compiled_region->empty()
                ? std::string(" (no module compiled alone breaks the step, only the whole model)")
                : " (module '" + *c.compiled_region + "' compiled alone breaks the step)");
  if (!c.first_birth)
    return c.reproduced ? "non-finite again on re-run, but no op was seen making it (a fused or compiled kernel, "
                          "a NaN written as a constant, or values non-finite before the step)"
                        : "not reproduced on re-run (transient)";
  std::string text = birth_text(*c.first_birth);
  if (!c.discarded.empty())
    text += "; before it, " + c.discarded.front() +
            (c.discarded.size() > 1 ? " (and " + std::to_string(c.discarded.size() - 1) + " more)" : "") +
            ", whose values never reached the loss or a gradient (the step discarded them, or never read them): "
            "not the cause";
  return text;
}

}  // namespace nanscope::format
