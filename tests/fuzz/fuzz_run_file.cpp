// run.h5 from outside: read whole (read_run, the rolled-back rows), followed
// live (RunFollower), its overview read (or built from its rows) and
// followed, a window of its per-layer rows fetched, and opened by the
// viewer's model (a long file through its overview).
#include <algorithm>

#include "fuzz_input.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/layer_rows_fetch.hpp"
#include "nanscope/format/overview_follower.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_overview.hpp"
#include "nanscope/viewer/view_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = nanscope::fuzz::input_file(data, size, ".h5");
  try {
    const nanscope::format::RunData run = nanscope::format::read_run(path);
    nanscope::format::rolled_back_rows(run);
    for (const auto& e : run.events) nanscope::format::warning_where(e.text);
  } catch (const nanscope::format::FormatError&) {}
  try {
    nanscope::format::RunFollower follower(path);
    follower.refresh();
  } catch (const nanscope::format::FormatError&) {}
  try {
    nanscope::format::OverviewFollower overview(path);
    overview.refresh();
    const nanscope::format::OverviewLevel& finest = overview.overview().levels.at(0);
    // The rows a zoomed-in view would fetch (read here: the fuzzer runs without the rehearsal's child).
    const size_t rows = size_t(overview.overview().rows);
    nanscope::format::LayerRowsFetch fetch(path, rows / 2, std::min(rows, rows / 2 + 100), finest.layer_grad_norm.width,
                                           finest.layer_grad_norm.width > 0, finest.layer_act_absmax.width > 0);
    if (fetch.ready()) fetch.take();
  } catch (const nanscope::format::FormatError&) {}
  nanscope::viewer::ViewModel model;  // never throws: a bad file is an entry in errors()
  model.open({path});
  return 0;
}
