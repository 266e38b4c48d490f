// RUN_DIR/options.toml: the options a run started with, as given, which
// --resume and --search-doom read back as their --config.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "nanscope/trainer/options_cli.hpp"

namespace nanscope::trainer {

std::vector<std::string> with_resume_config(const std::vector<std::string>& args) {
  std::vector<std::string> out = args;
  auto resume = std::find(args.begin(), args.end(), "--resume");
  if (resume == args.end()) resume = std::find(args.begin(), args.end(), "--search-doom");
  const bool has_config = std::any_of(
      args.begin(), args.end(), [](const std::string& a) { return a == "--config" || a.rfind("--config=", 0) == 0; });
  if (resume == args.end() || resume + 1 == args.end() || has_config) return out;
  out.insert(out.begin() + 1, {"--config", (std::filesystem::path(*(resume + 1)) / kOptionsFile).string()});
  return out;
}

bool kept_in_options_file(const std::string& long_name) {
  // Each rank's own place in the run, which a resume gets from its own launch.
  static const std::set<std::string> kRanksOwn{"rank", "local-rank", "master-addr", "master-port"};
  std::string key = long_name;
  std::replace(key.begin(), key.end(), '-', '_');
  return recorded_in_run_config(key) && kRanksOwn.count(long_name) == 0;
}

void write_options_file(const CLI::App& app, const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  const std::filesystem::path path = std::filesystem::path(run_dir) / kOptionsFile;
  std::ofstream out(path);
  out << "# The options this run started with, as given; nanscope-train --resume RUN_DIR reads them.\n";
  auto quoted = [](const std::string& v) {
    std::string q = "\"";
    for (char c : v) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return q + "\"";
  };
  // The app's own options and its option groups' (the model sizes, rollback), which CLI11 keeps apart.
  std::vector<const CLI::Option*> options = app.get_options();
  for (const CLI::App* group : app.get_subcommands(std::function<bool(const CLI::App*)>{}))
    for (const CLI::Option* opt : group->get_options()) options.push_back(opt);
  for (const CLI::Option* opt : options) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = opt->get_lnames().front();
    if (!kept_in_options_file(name)) continue;
    // The values as parsed: a transformed one (--amp bf16) holds what its
    // transform made of it, which the transform accepts back.
    const std::vector<std::string>& values = opt->results();
    if (opt->get_expected_max() == 0) {
      // A flag: whether it was given, as the config reader takes it. Its
      // parsed value is not that: --no-shuffle{false} gives "false", which
      // read back would mean the flag was not given.
      const bool given = values.empty() || values.back() == opt->get_flag_value(name, "");
      out << name << "=" << (given ? "true" : "false") << "\n";
    } else if (opt->get_expected_max() > 1) {
      out << name << "=[";
      for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << quoted(values[i]);
      out << "]\n";
    } else if (!values.empty()) {
      out << name << "=" << quoted(values.back()) << "\n";
    }
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace nanscope::trainer
