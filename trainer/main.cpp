// nanscope-train: parse the command line into TrainOptions and call run().
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "nanscope/common/cli_help.hpp"
#include "nanscope/common/error_text.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "nanscope/core/guard_errors.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/trainer/dist_options.hpp"
#include "nanscope/trainer/doom_offline.hpp"
#include "nanscope/trainer/options_cli.hpp"
#include "nanscope/trainer/trainer.hpp"

int main(int argc, char** argv) {
  nanscope::trainer::TrainOptions options;
  CLI::App app{"", "nanscope-train"};  // the description is add_train_options's
  nanscope::use_nanscope_help(app);
  nanscope::trainer::add_train_options(app, options);
  std::vector<std::string> args(argv, argv + argc);
  args = nanscope::trainer::with_resume_config(args);
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);  // CLI11 takes them backwards, no argv[0]
    app.parse(reversed);
  } catch (const CLI::ConfigError& e) {  // a key of --config that is no option
    std::cerr << "nanscope-train: --config: " << e.what() << " (not an option: keys are the long flag names)\n";
    return nanscope::kExitBadInput;
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? nanscope::kExitOk : nanscope::kExitBadInput;
  } catch (const std::invalid_argument& e) {  // a bad --fault, from its callback
    std::cerr << "nanscope-train: " << e.what() << "\n";
    return nanscope::kExitBadInput;
  }
  try {
    nanscope::trainer::apply_defaults(options);
    nanscope::trainer::validate_options(options);
    if (!options.search_doom.empty()) {
      const nanscope::trainer::OfflineDoomSearch found = nanscope::trainer::search_doom_offline(options, std::cerr);
      if (options.doom_json)
        std::cout << nanscope::doom_json(found.finding, found.failing_step, found.steps_run,
                                         nanscope::doom_sentence(found.finding, found.failing_step, found.rows_text))
                  << "\n";
      else
        std::cout << "doomed by: " << found.text << "\n";
      return nanscope::kExitOk;
    }
    if (options.resume.empty() && options.dist.rank == 0) nanscope::trainer::write_options_file(app, options.run_dir);
    nanscope::trainer::TrainSummary summary = nanscope::trainer::run(options, std::cerr);
    nanscope::trainer::print_summary(summary, std::cout);
    return summary.interrupted ? nanscope::kExitInterrupted : nanscope::kExitOk;
  } catch (const std::invalid_argument& e) {
    std::cerr << "nanscope-train: " << e.what() << "\n";
    return nanscope::kExitBadInput;
  } catch (const nanscope::DeadRunError& e) {
    std::cerr << "nanscope-train: " << e.what() << "\n";
    return nanscope::kExitDeadRun;
  } catch (const nanscope::trainer::DistributedError& e) {
    std::cerr << "nanscope-train: " << e.what() << "\n";
    return nanscope::kExitPeerLost;
  } catch (const nanscope::format::WriteError& e) {
    std::cerr << "nanscope-train: training failed: cannot write " << e.what() << "\n";
    return nanscope::kExitFailed;
  } catch (const nanscope::format::FormatError& e) {
    std::cerr << "nanscope-train: bad input " << e.what() << "\n";
    return nanscope::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "nanscope-train: training failed: " << nanscope::one_line_error(e) << "\n";
    return nanscope::kExitFailed;
  }
}
