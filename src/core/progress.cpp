#include "core/progress.h"

#include <unistd.h>

#include <algorithm>

namespace krab::core {

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), out_(out),
      tty_(::isatty(::fileno(out)) != 0), start_(std::chrono::steady_clock::now()) {}

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

void ProgressBar::draw(int64_t done, const std::string& fields, bool final) {
  const auto now = std::chrono::steady_clock::now();
  double eta = -1;
  if (first_done_ >= 0 && done > first_done_) {
    const double secs = std::chrono::duration<double>(now - first_time_).count();
    eta = secs / static_cast<double>(done - first_done_) * static_cast<double>(total_ - done);
  }
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * std::min(done, total_) / total_);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  const std::string time = final ? "took " + format_duration(elapsed)
                                 : "ETA " + format_duration(eta);
  std::fprintf(out_, "%s%s [%s] %lld/%lld | %s | %s%s", tty_ ? "\r" : "", label_.c_str(),
               bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
               fields.c_str(), time.c_str(), tty_ ? "\033[K" : "\n");
  std::fflush(out_);
}

}  // namespace krab::core
