// Every option of nanscope-train survives RUN_DIR/options.toml: given on the
// command line, written as the run starts, and read back by --resume and
// --search-doom, which go on with (or search) the run as it was started; and
// the run config records it as given.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "../support/test_support.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/trainer/options_cli.hpp"

using nanscope::test::TempDir;
using nanscope::trainer::TrainOptions;

namespace options_file_test {

// Every option add_train_options declares, the option groups' included.
std::vector<const CLI::Option*> all_options(const CLI::App& app) {
  std::vector<const CLI::Option*> out = app.get_options();
  for (const CLI::App* group : app.get_subcommands(std::function<bool(const CLI::App*)>{}))
    for (const CLI::Option* opt : group->get_options()) out.push_back(opt);
  return out;
}

// Values to give an option, its own words (not its default) first: the first
// it accepts is the test's.
std::vector<std::string> candidates(const CLI::Option& opt) {
  std::vector<std::string> out;
  const std::string type = opt.get_type_name();
  if (type.find('|') != std::string::npos)
    for (size_t at = 0, bar; at <= type.size(); at = bar + 1) {
      bar = std::min(type.find('|', at), type.size());
      if (type.substr(at, bar - at) != opt.get_default_str()) out.push_back(type.substr(at, bar - at));
    }
  for (const char* v : {"3", "0.5", "lr_spike@2:10", "blocks.0.mlp,head"}) out.push_back(v);
  out.push_back("/tmp/nanscope-options-file-test/" + opt.get_lnames().front());
  return out;
}

// argv as a CLI11 app takes it (the last argument first).
void parse(CLI::App& app, std::vector<std::string> argv) {
  argv.erase(argv.begin());
  std::reverse(argv.begin(), argv.end());
  app.parse(argv);
}

// The run config (run.h5's /config) records the option as it was given:
// nanscope-train's own from their declaration, the guard's by the guard.
void expect_recorded_as_given(const std::string& name, const std::string& given, const TrainOptions& parsed) {
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  if (nanscope::find_guard_option(key) || !nanscope::trainer::recorded_in_run_config(key)) return;
  if (key == "fault") key = "faults";  // repeatable: all of this rank's
  const std::map<std::string, std::string> config = nanscope::trainer::recorded_options(parsed);
  ASSERT_EQ(config.count(key), 1u) << "the run config does not record --" << name;
  EXPECT_EQ(config.at(key), given.empty() ? "true" : given);  // a flag: in force
}

TEST(OptionsFile, EveryOptionOfNanscopeTrainSurvivesItAndResume) {
  TrainOptions defaults;
  CLI::App declared;
  nanscope::trainer::add_train_options(declared, defaults);
  size_t checked = 0;
  for (const CLI::Option* option : all_options(declared)) {
    // What the file leaves out on purpose is not read back either.
    if (option->get_lnames().empty() || !nanscope::trainer::kept_in_options_file(option->get_lnames().front()))
      continue;
    const std::string name = option->get_lnames().front();
    SCOPED_TRACE(name);
    TempDir dir;
    const std::string run_dir = dir.file("run");
    TrainOptions started;
    CLI::App start;
    nanscope::trainer::add_train_options(start, started);
    bool accepted = false;
    std::string given;  // the value the test gave ("" for a flag)
    for (const std::string& value :
         option->get_expected_max() == 0 ? std::vector<std::string>{""} : candidates(*option)) {
      std::vector<std::string> argv{"nanscope-train", "--" + name};
      if (!value.empty()) argv.push_back(value);
      if (name != "run-dir") argv.insert(argv.end(), {"--run-dir", run_dir});
      start.clear();
      started = TrainOptions{};
      try {
        parse(start, argv);
        accepted = true;
        given = value;
        break;
      } catch (const std::exception&) {
        // not a value this option takes (CLI11's refusal, or --fault's own): the next
      }
    }
    ASSERT_TRUE(accepted) << "no test value fits --" << name;
    nanscope::trainer::write_options_file(start, run_dir);
    expect_recorded_as_given(name, given, started);

    for (const char* reader : {"--resume", "--search-doom"}) {
      TrainOptions resumed;
      CLI::App resume;
      nanscope::trainer::add_train_options(resume, resumed);
      ASSERT_NO_THROW(parse(resume, nanscope::trainer::with_resume_config({"nanscope-train", reader, run_dir})))
          << reader;
      EXPECT_EQ(resume.get_option("--" + name)->results(), start.get_option("--" + name)->results())
          << reader << " reads --" << name << " back as something else";
      EXPECT_EQ(resume.get_option("--" + name)->count(), start.get_option("--" + name)->count()) << reader;
    }
    ++checked;
  }
  EXPECT_GT(checked, 40u) << "the options were not found";
}

// The run this was written for: a --no-shuffle run's file made --resume and
// --search-doom train and search on the shuffled order.
TEST(OptionsFile, ANoShuffleRunResumesInItsOwnOrder) {
  TempDir dir;
  const std::string run_dir = dir.file("run");
  TrainOptions started;
  CLI::App start;
  nanscope::trainer::add_train_options(start, started);
  parse(start, {"nanscope-train", "--no-shuffle", "--run-dir", run_dir});
  ASSERT_FALSE(started.shuffle);
  nanscope::trainer::write_options_file(start, run_dir);
  TrainOptions resumed;
  CLI::App resume;
  nanscope::trainer::add_train_options(resume, resumed);
  parse(resume, nanscope::trainer::with_resume_config({"nanscope-train", "--resume", run_dir}));
  EXPECT_FALSE(resumed.shuffle);
}

}  // namespace options_file_test
