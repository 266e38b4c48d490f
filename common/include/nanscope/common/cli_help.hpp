#pragma once
// How every nanscope command's --help reads, whichever CLI11 Debian ships
// (2.1 on bookworm, 2.6 on testing): "Usage: NAME [OPTIONS]", and the
// description and footer with the line breaks they were written with. CLI11
// 2.6 prints the program's name where "Usage:" stood and re-wraps
// descriptions and footers at 80 columns around their own breaks; this is the
// one place that knows. Options keep each version's own layout.
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#define NANSCOPE_CLI11_AT_LEAST(major, minor) \
  (CLI11_VERSION_MAJOR > (major) || (CLI11_VERSION_MAJOR == (major) && CLI11_VERSION_MINOR >= (minor)))

namespace nanscope {

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
#if NANSCOPE_CLI11_AT_LEAST(2, 6)
    enable_description_formatting(false);
    enable_footer_formatting(false);
#endif
  }

  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string usage = CLI::Formatter::make_usage(app, name);
#if NANSCOPE_CLI11_AT_LEAST(2, 6)
    // After the description's own blank line, not two more.
    usage.erase(0, usage.find_first_not_of('\n'));
    if (const size_t at = name.empty() ? std::string::npos : usage.find(name); at != std::string::npos)
      usage.insert(at, get_label("Usage") + ": ");
#endif
    return usage;
  }
};

// Gives `app` nanscope's help layout.
inline void use_nanscope_help(CLI::App& app) { app.formatter(std::make_shared<HelpFormatter>()); }

}  // namespace nanscope
