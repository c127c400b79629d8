// The progress line fits the terminal: a line longer than the terminal wraps, and every redraw
// ("\r" + line) then stacks a new line instead of replacing the old one.
#include "core/progress.h"

#include <gtest/gtest.h>

namespace krab::core {
namespace {

const std::string kFields = "acc 0.8123 loss 0.4567 clients 10/10 eps 3.081";

TEST(ProgressBar, AWideTerminalGetsTheWholeLine) {
  const std::string s = ProgressBar::compose("fl-sim", 3, 6, kFields, "ETA 0:04", 200);
  EXPECT_EQ(s, "fl-sim [############............] 3/6 | " + kFields + " | ETA 0:04");
}

TEST(ProgressBar, EveryWidthFitsAndKeepsTheCounter) {
  for (int columns = 1; columns <= 120; ++columns) {
    const std::string s = ProgressBar::compose("train", 37, 400, kFields, "ETA 1:02:03", columns);
    EXPECT_LE(s.size(), static_cast<size_t>(std::max(columns - 1, 1))) << columns << ": " << s;
    if (columns >= 50) EXPECT_NE(s.find("37/400"), std::string::npos) << columns << ": " << s;
  }
  // At 50 columns the bar shrinks and the fields are cut, but the time stays.
  const std::string s50 = ProgressBar::compose("train", 37, 400, kFields, "ETA 1:02:03", 50);
  EXPECT_NE(s50.find("ETA 1:02:03"), std::string::npos) << s50;
  EXPECT_NE(s50.find(".. |"), std::string::npos) << s50;
}

}  // namespace
}  // namespace krab::core
