// A --config file from outside (TOML or INI), parsed into nanscope-train's
// options and validated, as nanscope-train and --resume do.
#include <CLI/CLI.hpp>

#include "fuzz_input.hpp"
#include "nanscope/trainer/options_cli.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = nanscope::fuzz::input_file(data, size, ".toml");
  nanscope::trainer::TrainOptions options;
  CLI::App app{"nanscope-train"};
  nanscope::trainer::add_train_options(app, options);
  try {
    app.parse(std::vector<std::string>{path, "--config"});  // CLI11 takes them backwards
    nanscope::trainer::apply_defaults(options);
    nanscope::trainer::validate_options(options);
  } catch (const CLI::Error&) {
  } catch (const std::invalid_argument&) {  // --fault's parser and validate_options
  } catch (const std::out_of_range&) {}
  return 0;
}
