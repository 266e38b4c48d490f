// nanscope-report: parse the command line into ReportOptions and call run().
#include <CLI/CLI.hpp>

#include <iostream>

#include "nanscope/common/cli_help.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "report.hpp"

int main(int argc, char** argv) {
  nanscope::report::ReportOptions options;
  CLI::App app{
      "Reads a nanscope run where there is no display: its summary (who ran the loop, the config, steps\n"
      "recorded, counted and skipped, the final and last finite loss, the precision over the run and\n"
      "the fp16 loss scale), then its events section by section (skips, first births, warnings,\n"
      "rollbacks, fallbacks and remedies, refused saves, stop, resumes, ranks) and its snapshots:\n"
      "each one's step, first birth, the batch rows it made non-finite and their data-set rows, and\n"
      "nanscope-replay's verdict once it has run. A run of several processes is reported rank by rank.\n"
      "\n"
      "--follow reads a run while it is written: the events as they are committed and a progress\n"
      "line every --interval seconds, then the report. It ends when every run file has ended (the\n"
      "run wrote a `stop` event, or its writer closed the file: the run finished, failed or was\n"
      "interrupted), after --until-idle seconds with nothing new (a killed writer never closes its\n"
      "file), or on Ctrl-C (exit 130). A run directory with no run file yet is waited for.\n"
      "\n"
      "Exit codes: 0 reported; 2 bad input (a missing path, a directory with no run file, a file\n"
      "that is not a run file or is corrupt: one line naming it; a snapshot that cannot be read is\n"
      "listed as unreadable, not an error); 130 --follow ended by Ctrl-C.",
      "nanscope-report"};
  nanscope::use_nanscope_help(app);
  app.add_option("RUN", options.input, "A run directory (run.h5 or run-rank-R.h5, snapshots/) or one run file")
      ->required();
  auto* follow = app.add_flag("--follow", options.follow, "Follow a live run until it ends (see above)");
  app.add_flag("--json", options.json,
               "Print one JSON object with every event and snapshot (non-finite numbers as \"nan\", \"inf\")")
      ->excludes(follow);
  app.add_option("--limit", options.limit, "Text: entries shown per section before '... and N more'; 0: all")
      ->capture_default_str();
  app.add_option("--interval", options.interval_s, "--follow: seconds between progress lines")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(follow);
  app.add_option("--until-idle", options.until_idle_s,
                 "--follow: end after this many seconds with no new row or event (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->needs(follow);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? nanscope::kExitOk : nanscope::kExitBadInput;
  }
  try {
    return nanscope::report::run(options, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "nanscope-report: failed: " << e.what() << "\n";
    return nanscope::kExitFailed;
  }
}
