// run.h5 from outside: read whole (read_run, the rolled-back rows), followed
// live (RunFollower), its overview read (or built from its rows), and opened
// by the viewer's model.
#include "fuzz_input.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/event_text.hpp"
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
    nanscope::format::read_run_overview(path);
  } catch (const nanscope::format::FormatError&) {}
  nanscope::viewer::ViewModel model;  // never throws: a bad file is an entry in errors()
  model.open({path});
  return 0;
}
