// One progress bar for long work: step, caller's fields (loss, samples/s), ETA.
//
// On a terminal the bar redraws in place at most every 100 ms; when stderr is a file or a pipe
// (CI logs) it prints a plain line at every 10% instead, so logs stay readable. ETA is from
// the average rate since the first update. On a terminal the line is fitted to its width.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace krab::core {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::FILE* out = stderr);
  // `done` units of `total` completed; `fields` is free text shown after the counter.
  void update(int64_t done, const std::string& fields);
  // Final draw (always printed) and a newline.
  void finish(const std::string& fields);

  // "1:02:03" / "4:05".
  static std::string format_duration(double seconds);

  // One bar line that fits in `columns` terminal columns (the cursor needs one more, so the text
  // is at most columns - 1): the bar shrinks first (to 8 cells), then the fields are cut with
  // "…"-free "..", then the line itself. A line longer than the terminal would wrap, and every
  // redraw would then add a line instead of replacing one.
  static std::string compose(const std::string& label, int64_t done, int64_t total,
                             const std::string& fields, const std::string& time, int columns);
  // The terminal's width in columns for `out` (TIOCGWINSZ, then $COLUMNS, then 80).
  static int terminal_columns(std::FILE* out);

 private:
  void draw(int64_t done, const std::string& fields, bool final);

  std::string label_;
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int64_t first_done_ = -1;
  std::chrono::steady_clock::time_point first_time_;
  int last_decile_ = -1;
};

}  // namespace krab::core
