#include "report.hpp"

#include <algorithm>

#include "follow.hpp"
#include "json_report.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "nanscope/format/error.hpp"
#include "run_location.hpp"
#include "run_report.hpp"
#include "text_report.hpp"

namespace nanscope::report {

namespace {

// One line, whatever the message holds.
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

int run(const ReportOptions& options, std::ostream& out, std::ostream& err) {
  try {
    if (options.follow)
      return follow_run(options.input, {options.interval_s, options.until_idle_s, options.limit}, out);
    const RunReport report = read_report(options.input, locate_run(options.input, /*may_be_empty=*/false));
    const bool any_readable =
        std::any_of(report.ranks.begin(), report.ranks.end(), [](const RankReport& r) { return r.run.has_value(); });
    if (any_readable) {
      if (options.json)
        write_json(report, out);
      else
        write_text(report, options.limit, out);
    }
    int exit_code = kExitOk;
    for (const RankReport& r : report.ranks) {
      if (r.run) continue;
      err << "nanscope-report: bad run file " << one_line(r.error) << "\n";
      exit_code = kExitBadInput;
    }
    return exit_code;
  } catch (const format::FormatError& e) {
    err << "nanscope-report: bad input " << one_line(e.what()) << "\n";
    return kExitBadInput;
  }
}

}  // namespace nanscope::report
