#include "core/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace krab::core {

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      out_(out),
      tty_(::isatty(::fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {}

std::string ProgressBar::format_duration(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "--:--";
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  return buf;
}

void ProgressBar::update(int64_t done, const std::string& fields) {
  const auto now = std::chrono::steady_clock::now();
  if (first_done_ < 0) {
    first_done_ = done;
    first_time_ = now;
  }
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total_) return;
    last_draw_ = now;
    draw(done, fields, false);
  } else {
    const int decile = static_cast<int>(10 * done / total_);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    draw(done, fields, false);
  }
}

void ProgressBar::finish(const std::string& fields) {
  draw(total_, fields, true);
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

std::string ProgressBar::compose(const std::string& label, int64_t done, int64_t total,
                                 const std::string& fields, const std::string& time, int columns) {
  total = std::max<int64_t>(total, 1);
  const std::string count = std::to_string(done) + "/" + std::to_string(total);
  auto line = [&](int cells, const std::string& f) {
    const int filled = static_cast<int>(cells * std::min(done, total) / total);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(cells - filled), '.');
    return label + " [" + bar + "] " + count + " | " + f + " | " + time;
  };
  const size_t room = static_cast<size_t>(std::max(columns - 1, 1));
  constexpr int kWidth = 24, kMinWidth = 8;
  std::string out = line(kWidth, fields);
  if (out.size() <= room) return out;
  const size_t over = out.size() - room;
  const int cells = std::max(kMinWidth, kWidth - static_cast<int>(over));
  out = line(cells, fields);
  if (out.size() <= room) return out;
  const size_t cut = out.size() - room;
  if (cut + 2 < fields.size()) return line(cells, fields.substr(0, fields.size() - cut - 2) + "..");
  out = line(cells, "");
  return out.size() <= room ? out : out.substr(0, room);
}

int ProgressBar::terminal_columns(std::FILE* out) {
  winsize ws{};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

void ProgressBar::draw(int64_t done, const std::string& fields, bool final) {
  const auto now = std::chrono::steady_clock::now();
  double eta = -1;
  if (first_done_ >= 0 && done > first_done_) {
    const double secs = std::chrono::duration<double>(now - first_time_).count();
    eta = secs / static_cast<double>(done - first_done_) * static_cast<double>(total_ - done);
  }
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::string time =
      final ? "took " + format_duration(elapsed) : "ETA " + format_duration(eta);
  // A log file has no width: only a terminal's line is fitted.
  const std::string text =
      compose(label_, done, total_, fields, time, tty_ ? terminal_columns(out_) : 1 << 20);
  std::fprintf(out_, "%s%s%s", tty_ ? "\r" : "", text.c_str(), tty_ ? "\033[K" : "\n");
  std::fflush(out_);
}

}  // namespace krab::core
