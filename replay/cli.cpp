// nanscope-replay's command line (replay_main): re-run a snapshot's step
// offline and say why it went NaN.
#include <CLI/CLI.hpp>

#include <iostream>

#include "nanscope/common/blas_threads.hpp"
#include "nanscope/common/cli_help.hpp"
#include "nanscope/common/error_text.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/replay/inspect.hpp"
#include "nanscope/replay/model_registry.hpp"
#include "nanscope/replay/replay.hpp"
#include "nanscope/replay/replay_report.hpp"

namespace nanscope::replay {

int replay_main(int argc, const char* const* argv) {
  nanscope::keep_blas_single_threaded();  // the replay's re-runs are many small steps: blas_threads.hpp
  nanscope::replay::ReplayOptions options;
  bool json = false, no_write = false, inspect = false;
  CLI::App app{
      "Re-runs the step a nanscope snapshot holds, with no other file: at its own precision and\n"
      "loss scale (N times), in fp32 with op-level capture and anomaly detection; bisects which\n"
      "modules need fp32 and which samples the step cannot survive; re-runs it with the other\n"
      "kernels the born op has here (attention's backends, oneDNN on the CPU); and says whether\n"
      "it is precision, the model or the data, a kernel, or transient, with a fix from the\n"
      "playbook. For a\n"
      "precision verdict it compares the step with fp32 op by op up to the birth and names the\n"
      "first op whose error passes 16 ulps of the low type: where precision was lost.\n"
      "A snapshot of a TorchScript model carries its program, and replaying runs it: as with any\n"
      "TorchScript or pickle file, replay only snapshots from a source you trust. --inspect shows\n"
      "what a snapshot holds (its model's kind and origin, the program's files and size, the\n"
      "weights' and the batch's names and shapes) without running or loading any of it.\n"
      "Exit codes: 0 a verdict (or the inspection), 1 replay failed, 2 bad input.",
      "nanscope-replay"};
  nanscope::use_nanscope_help(app);
  app.add_option("SNAPSHOT", options.snapshot, "A snapshots/step-NNNNNNN.h5 file")->required();
  app.add_flag("--json", json, "Print one JSON object (its fields are in the README) instead of the report");
  app.add_option("--repeats", options.repeats, "Re-runs at the original precision (0 of N: transient)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-bisect{false}", options.bisect, "Skip the precision and batch bisections");
  app.add_flag("--no-write", no_write, "Do not append the result to the snapshot");
  app.add_flag("--inspect", inspect,
               "Show what the snapshot holds and what replaying it would run, without running it (with --json: "
               "one JSON object)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitBadInput;
  }
  try {
    if (inspect) {
      const SnapshotInspection inspection = inspect_snapshot(options.snapshot);
      std::cout << (json ? to_json(inspection) : to_text(inspection));
      return kExitOk;
    }
    nanscope::replay::ReplayReport report = nanscope::replay::replay_snapshot(options);
    std::cout << (json ? nanscope::replay::to_json(report) : nanscope::replay::to_text(report));
    if (!no_write) {
      try {
        nanscope::replay::append_to_snapshot(options.snapshot, report);
      } catch (const nanscope::format::FormatError& e) {
        std::cerr << "nanscope-replay: result not appended to the snapshot: " << e.what() << "\n";
      }
    }
    return kExitOk;
  } catch (const nanscope::format::FormatError& e) {
    std::cerr << "nanscope-replay: bad snapshot " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::invalid_argument& e) {
    std::cerr << "nanscope-replay: bad snapshot " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "nanscope-replay: replay failed: " << nanscope::one_line_error(e) << "\n";
    return kExitFailed;
  }
}

}  // namespace nanscope::replay
