#include "nanscope/format/poison_list.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "nanscope/common/json_text.hpp"
#include "nanscope/format/error.hpp"

namespace nanscope::format {

namespace {

// One line's flat JSON object: string and integer values (anything else a
// reader does not know is skipped if it is a string, number, true, false or
// null). Throws std::runtime_error saying what is wrong.
class LineParser {
 public:
  explicit LineParser(const std::string& text) : s_(text) {}

  PoisonedSample parse() {
    PoisonedSample out;
    bool has_row = false, has_step = false;
    expect('{');
    if (!peek('}')) {
      do {
        const std::string key = string_value();
        expect(':');
        if (key == "row") {
          out.row = integer_value();
          has_row = true;
        } else if (key == "step") {
          out.step = integer_value();
          has_step = true;
        } else if (key == "rank") {
          out.rank = int(integer_value());
        } else if (key == "birth") {
          out.birth = string_value();
        } else if (key == "why") {
          out.why = string_value();
        } else {
          skip_value();
        }
      } while (take(','));
    }
    expect('}');
    skip_space();
    if (at_ != s_.size()) throw std::runtime_error("text after the object");
    if (!has_row || out.row < 0) throw std::runtime_error("no \"row\" (a data set row, 0 or more)");
    if (!has_step) throw std::runtime_error("no \"step\"");
    return out;
  }

 private:
  void skip_space() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  bool peek(char c) {
    skip_space();
    return at_ < s_.size() && s_[at_] == c;
  }
  bool take(char c) {
    if (!peek(c)) return false;
    ++at_;
    return true;
  }
  void expect(char c) {
    if (!take(c)) throw std::runtime_error(std::string("'") + c + "' expected at column " + std::to_string(at_ + 1));
  }
  std::string string_value() {
    expect('"');
    std::string out;
    while (at_ < s_.size() && s_[at_] != '"') {
      char c = s_[at_++];
      if (c == '\\') {
        if (at_ >= s_.size()) break;
        const char e = s_[at_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': {
            if (at_ + 4 > s_.size()) throw std::runtime_error("a \\u escape cut short");
            const unsigned code = unsigned(std::stoul(s_.substr(at_, 4), nullptr, 16));
            at_ += 4;
            c = code < 0x80 ? char(code) : '?';  // the words are ASCII; another character is shown as '?'
            break;
          }
          default: c = e;  // \" \\ \/
        }
      }
      out += c;
    }
    expect('"');
    return out;
  }
  int64_t integer_value() {
    skip_space();
    const size_t begin = at_;
    if (at_ < s_.size() && s_[at_] == '-') ++at_;
    while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) ++at_;
    if (at_ == begin || (at_ == begin + 1 && s_[begin] == '-'))
      throw std::runtime_error("a whole number expected at column " + std::to_string(begin + 1));
    try {
      return std::stoll(s_.substr(begin, at_ - begin));
    } catch (const std::out_of_range&) {
      throw std::runtime_error("a number out of range at column " + std::to_string(begin + 1));
    }
  }
  void skip_value() {
    skip_space();
    if (peek('"')) {
      string_value();
      return;
    }
    const size_t begin = at_;
    while (at_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[at_])) || std::strchr("+-.", s_[at_]))) ++at_;
    if (at_ == begin) throw std::runtime_error("a value expected at column " + std::to_string(begin + 1));
  }

  const std::string& s_;
  size_t at_ = 0;
};

std::string line_of(const PoisonedSample& s) {
  return "{\"row\": " + std::to_string(s.row) + ", \"step\": " + std::to_string(s.step) +
         ", \"rank\": " + std::to_string(s.rank) + ", \"birth\": " + json_quoted(s.birth) +
         ", \"why\": " + json_quoted(s.why) + "}\n";
}

}  // namespace

std::string poison_list_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / kPoisonListFile).string();
}

std::vector<PoisonedSample> read_poison_list(const std::string& path) {
  std::vector<PoisonedSample> out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  std::ifstream in(path);
  if (!in) throw FormatError(path, "cannot be read");
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are nothing
    try {
      out.push_back(LineParser(line).parse());
    } catch (const std::exception& e) {
      throw FormatError(path, "line " + std::to_string(number) + " is not a listed sample (" + e.what() +
                                  "): a line is {\"row\": DATA_SET_ROW, \"step\": STEP, ...}; delete a line to "
                                  "restore its sample");
    }
  }
  return out;
}

void append_poisoned_sample(const std::string& path, const PoisonedSample& sample) {
  const std::string line = line_of(sample);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw WriteError(path, std::string("cannot append to it: ") + std::strerror(errno));
  const ssize_t written = ::write(fd, line.data(), line.size());
  const int error = errno;
  ::close(fd);
  if (written != ssize_t(line.size()))
    throw WriteError(path, std::string("cannot append to it: ") + std::strerror(error));
}

size_t start_poison_list_anew(const std::string& path) {
  std::vector<PoisonedSample> list = read_poison_list(path);
  if (list.empty()) return 0;
  std::string text;
  for (PoisonedSample& s : list) {
    s.step = kListedBeforeTheRun;
    text += line_of(s);
  }
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!out.flush()) throw WriteError(temporary, "cannot be written (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) throw WriteError(path, "cannot be replaced: " + ec.message());
  return list.size();
}

std::vector<int64_t> rows_left_out_at(const std::vector<PoisonedSample>& list, int64_t step) {
  std::vector<int64_t> rows;
  for (const PoisonedSample& s : list)
    if (s.step <= step - 2) rows.push_back(s.row);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace nanscope::format
