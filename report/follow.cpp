#include "follow.hpp"

#include <chrono>
#include <csignal>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "nanscope/common/exit_codes.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "run_location.hpp"
#include "run_report.hpp"
#include "run_summary.hpp"
#include "text_report.hpp"

namespace nanscope::report {

namespace {

using Clock = std::chrono::steady_clock;

// New rows reach the file every 16 steps or on a skip; a fifth of a second
// between looks shows an event as it lands and costs nothing.
constexpr auto kPollPeriod = std::chrono::milliseconds(200);

volatile std::sig_atomic_t interrupted = 0;
void on_interrupt(int) { interrupted = 1; }

// Ctrl-C (and SIGTERM) end following cleanly, with the report, while this lives.
class InterruptGuard {
 public:
  InterruptGuard() {
    interrupted = 0;
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One run file being followed.
struct FollowedFile {
  explicit FollowedFile(format::RankFile f) : file(std::move(f)) {}
  format::RankFile file;
  std::unique_ptr<format::RunFollower> follower;
  Clock::time_point first_try = Clock::now();
  size_t events_shown = 0, rows_at_progress = 0;
  std::string ended;  // why following it ended; "" while it goes on

  std::string prefix() const { return file.rank >= 0 ? "rank " + std::to_string(file.rank) + "  " : ""; }
};

class FollowSession {
 public:
  FollowSession(const RunLocation& location, const FollowOptions& options, std::ostream& out)
      : location_(location), options_(options), out_(out) {
    for (const format::RankFile& file : location.files) files_.emplace_back(file);
  }

  // One look at every file; true when anything new was committed.
  bool poll() {
    if (location_.is_directory) discover_new_files();
    bool news = false;
    for (FollowedFile& f : files_) news |= poll_file(f);
    return news;
  }

  bool all_ended() const {
    if (files_.empty()) return false;
    for (const FollowedFile& f : files_)
      if (f.ended.empty()) return false;
    return true;
  }

  void progress() {
    for (FollowedFile& f : files_) {
      if (!f.follower) continue;
      const format::RunData& run = f.follower->data();
      if (run.rows() == f.rows_at_progress) continue;  // nothing new: no line
      f.rows_at_progress = run.rows();
      size_t skipped = 0;
      for (uint8_t s : run.skipped) skipped += s;
      const size_t last = run.rows() - 1;
      out_ << f.prefix() << "progress: step " << run.step[last] << "  loss " << value_text(run.loss[last]) << "  "
           << format::to_string(row_precision(run.amp[last])) << "  " << run.rows() << " rows, " << skipped
           << " skipped\n"
           << std::flush;
    }
  }

  std::string why_ended() const {
    std::string why;
    for (const FollowedFile& f : files_) why += (why.empty() ? "" : "; ") + f.prefix() + f.ended;
    return why;
  }

  bool any_file() const { return !files_.empty(); }

  // The run as it is now, for the closing report.
  RunReport report(const std::string& input) const {
    RunReport r;
    r.input = input;
    r.left_out = read_left_out(location_.run_dir);
    for (const FollowedFile& f : files_) {
      if (f.follower) {
        r.ranks.push_back(rank_report(location_.run_dir, f.file, f.follower->data()));
      } else {
        RankReport unopened;
        unopened.file = f.file;
        unopened.error = "'" + f.file.path + "': could not be opened while following";
        r.ranks.push_back(std::move(unopened));
      }
    }
    return r;
  }

 private:
  void discover_new_files() {
    for (const format::RankFile& file : format::run_files_in(location_.run_dir)) {
      bool known = false;
      for (const FollowedFile& f : files_) known |= f.file.path == file.path;
      if (!known) files_.emplace_back(file);
    }
  }

  // Opens the file if it is not open yet; false while a writer is still creating it.
  bool open(FollowedFile& f) {
    if (f.follower) return true;
    try {
      f.follower = std::make_unique<format::RunFollower>(f.file.path, format::LayerTables::skip);
    } catch (const format::FormatError&) {
      if (seconds_since(f.first_try) < kOpenGraceSeconds) return false;
      throw;
    }
    // What was committed before following began: the last few events.
    const std::vector<format::RunEvent>& events = f.follower->data().events;
    const size_t shown = options_.limit == 0 ? events.size() : std::min(options_.limit, events.size());
    out_ << f.prefix() << f.file.path << ": " << f.follower->data().rows() << " rows, " << events.size()
         << " events so far";
    if (shown < events.size()) out_ << " (the last " << shown << " follow)";
    out_ << "\n";
    f.events_shown = events.size() - shown;
    return true;
  }

  bool poll_file(FollowedFile& f) {
    if (!f.ended.empty() || !open(f)) return false;
    // Asked before the refresh, so the rows a writer committed before closing are read below.
    const bool writer_closed = !format::has_writer_mark(f.file.path);
    const size_t rows = f.follower->refresh();
    const std::vector<format::RunEvent>& events = f.follower->data().events;
    if (events.size() < f.events_shown) f.events_shown = events.size();  // a resume dropped some
    const bool new_events = events.size() > f.events_shown;
    for (; f.events_shown < events.size(); ++f.events_shown) {
      const format::RunEvent& e = events[f.events_shown];
      out_ << f.prefix() << event_line(e) << "\n";
      if (e.kind == format::EventKind::stop) f.ended = "the run stopped at step " + std::to_string(e.step);
    }
    out_ << std::flush;
    if (f.ended.empty() && writer_closed) f.ended = "its writer closed " + f.file.path;
    return rows > 0 || new_events;
  }

  RunLocation location_;
  FollowOptions options_;
  std::ostream& out_;
  std::vector<FollowedFile> files_;
};

}  // namespace

int follow_run(const std::string& input, const FollowOptions& options, std::ostream& out) {
  const RunLocation location = locate_run(input, /*may_be_empty=*/true);
  FollowSession session(location, options, out);
  InterruptGuard interrupt_guard;
  if (!session.any_file()) out << "waiting for a run file in " << input << "\n" << std::flush;

  const Clock::time_point start = Clock::now();
  Clock::time_point last_news = start, last_progress = start;
  std::string why;
  int exit_code = kExitOk;
  for (;;) {
    if (interrupted) {
      why = "interrupted";
      exit_code = kExitInterrupted;
      break;
    }
    if (session.poll()) last_news = Clock::now();
    if (session.all_ended()) {
      why = session.why_ended();
      break;
    }
    if (seconds_since(last_progress) >= options.interval_s) {
      session.progress();
      last_progress = Clock::now();
    }
    if (options.until_idle_s > 0 && seconds_since(last_news) >= options.until_idle_s) {
      if (!session.any_file())
        throw format::FormatError(input, "no run file appeared in " + number_text(options.until_idle_s) + " s");
      why = "nothing new for " + number_text(options.until_idle_s) + " s";
      break;
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  out << "following ended: " << why << "\n\n";
  write_text(session.report(input), options.limit, out);
  return exit_code;
}

}  // namespace nanscope::report
