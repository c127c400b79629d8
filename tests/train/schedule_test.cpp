// Learning-rate schedules against their closed forms.
#include "train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/errors.h"

namespace krab::train {
namespace {

TEST(Schedule, ConstantIsConstant) {
  for (int64_t s : {0, 1, 50, 99})
    EXPECT_DOUBLE_EQ(learning_rate(Schedule::kConstant, 0.1, s, 100, 0), 0.1);
}

TEST(Schedule, CosineStartsAtLrEndsAtZeroAndIsHalfwayInTheMiddle) {
  EXPECT_DOUBLE_EQ(learning_rate(Schedule::kCosine, 0.2, 0, 100, 0), 0.2);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 0.2, 50, 100, 0), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 0.2, 25, 100, 0), 0.1 * (1 + std::cos(M_PI / 4)),
              1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 0.2, 100, 100, 0), 0.0, 1e-12);
  // Monotone non-increasing.
  for (int64_t s = 1; s < 100; ++s)
    EXPECT_LE(learning_rate(Schedule::kCosine, 0.2, s, 100, 0),
              learning_rate(Schedule::kCosine, 0.2, s - 1, 100, 0));
}

TEST(Schedule, LinearDecay) {
  EXPECT_NEAR(learning_rate(Schedule::kLinear, 1.0, 30, 40, 0), 0.25, 1e-12);
}

TEST(Schedule, WarmupRampsThenHandsOver) {
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 1.0, 0, 110, 10), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 1.0, 4, 110, 10), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 1.0, 9, 110, 10), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 1.0, 10, 110, 10), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kCosine, 1.0, 60, 110, 10), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(Schedule::kConstant, 1.0, 2, 110, 4), 0.75, 1e-12);
}

TEST(Schedule, UnknownNameIsRefusedNamingTheKey) {
  EXPECT_EQ(parse_schedule("cosine"), Schedule::kCosine);
  try {
    parse_schedule("cosin");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.lr_schedule"), std::string::npos);
  }
}

}  // namespace
}  // namespace krab::train
