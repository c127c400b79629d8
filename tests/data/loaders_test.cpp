// The byte-level text loader and the synthetic classification set.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "core/errors.h"
#include "data/dataset.h"
#include "test_util.h"

namespace krab::data {
namespace {

using testing::expect_throw_containing;
using testing::TempDir;

std::string write_text(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("corpus.txt");
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// ---- text ----------------------------------------------------------------------------------

TEST(LoadText, WindowsAndShift) {
  TempDir dir;
  // 23 bytes, context 4: windows of 5 -> 4 windows, 3 tail bytes dropped.
  const std::string text = "abcdefghijklmnopqrstuvw";
  const DataSplits s = load_text(write_text(dir, text), 4, 0.0);
  EXPECT_TRUE(s.language_model);
  EXPECT_EQ(s.num_classes, 256);
  EXPECT_EQ(s.input_shape, (std::vector<int64_t>{4}));
  EXPECT_FALSE(s.test.has_value());
  ASSERT_EQ(s.train.inputs.sizes(), (std::vector<int64_t>{4, 4}));
  ASSERT_EQ(s.train.targets.sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(s.train.inputs.scalar_type(), torch::kInt64);
  EXPECT_EQ(s.train.targets.scalar_type(), torch::kInt64);
  for (int64_t w = 0; w < 4; ++w) {
    for (int64_t t = 0; t < 4; ++t) {
      EXPECT_EQ(s.train.inputs[w][t].item<int64_t>(), text[w * 5 + t]);
      EXPECT_EQ(s.train.targets[w][t].item<int64_t>(), text[w * 5 + t + 1]);
    }
  }
}

TEST(LoadText, LastWindowsAreTheTestSplit) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 100; ++i) text.push_back(static_cast<char>('A' + i % 26));
  const DataSplits s = load_text(write_text(dir, text), 9, 0.2);  // 10 windows -> 8 + 2
  ASSERT_TRUE(s.test.has_value());
  EXPECT_EQ(s.train.size(), 8);
  EXPECT_EQ(s.test->size(), 2);
  EXPECT_EQ(s.test->inputs[0][0].item<int64_t>(), text[80]);
  EXPECT_EQ(s.test->targets[1][8].item<int64_t>(), text[99]);
}

TEST(LoadText, TinyFractionStillGivesOneTestWindow) {
  TempDir dir;
  const DataSplits s = load_text(write_text(dir, std::string(30, 'x')), 4, 0.01);  // 6 windows
  ASSERT_TRUE(s.test.has_value());
  EXPECT_EQ(s.test->size(), 1);
  EXPECT_EQ(s.train.size(), 5);
}

TEST(LoadText, HighBytesAreTokensAbove127) {
  TempDir dir;
  const std::string text("\xff\x80\x01\x00\xfe\x7f", 6);  // has a NUL inside
  const DataSplits s = load_text(write_text(dir, text), 2, 0.0);
  EXPECT_TRUE(s.train.inputs.equal(torch::tensor({255, 128, 0, 254}, torch::kInt64).view({2, 2})));
  EXPECT_TRUE(s.train.targets.equal(torch::tensor({128, 1, 254, 127}, torch::kInt64).view({2, 2})));
}

TEST(LoadText, TooSmallFile) {
  TempDir dir;
  const std::string path = write_text(dir, std::string(20, 'x'));
  // context 10 -> windows of 11 -> needs 22 bytes.
  expect_throw_containing<InvalidArgument>([&] { load_text(path, 10, 0.1); },
                                           {path, "20 bytes", "22"});
}

TEST(LoadText, MissingFileAndBadArguments) {
  expect_throw_containing<InvalidArgument>([] { load_text("/nonexistent/krab.txt", 8, 0.1); },
                                           {"/nonexistent/krab.txt"});
  TempDir dir;
  const std::string path = write_text(dir, std::string(100, 'x'));
  EXPECT_THROW(load_text(path, 0, 0.1), InvalidArgument);
  EXPECT_THROW(load_text(path, 4, 1.0), InvalidArgument);
  EXPECT_THROW(load_text(path, 4, -0.1), InvalidArgument);
}

// ---- synthetic -----------------------------------------------------------------------------

TEST(MakeSynthetic, ShapesAndSplit) {
  const DataSplits s = make_synthetic(1000, 16, 5, 0.2, 3);
  EXPECT_EQ(s.train.inputs.sizes(), (std::vector<int64_t>{800, 16}));
  EXPECT_EQ(s.train.targets.sizes(), (std::vector<int64_t>{800}));
  ASSERT_TRUE(s.test.has_value());
  EXPECT_EQ(s.test->inputs.sizes(), (std::vector<int64_t>{200, 16}));
  EXPECT_EQ(s.input_shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(s.num_classes, 5);
  EXPECT_FALSE(s.language_model);
  EXPECT_EQ(s.train.inputs.scalar_type(), torch::kFloat32);
  EXPECT_EQ(s.train.targets.scalar_type(), torch::kInt64);
  EXPECT_GE(s.train.targets.min().item<int64_t>(), 0);
  EXPECT_LT(s.train.targets.max().item<int64_t>(), 5);
  // Labels are drawn uniformly: every class is well represented.
  const at::Tensor counts = torch::bincount(s.train.targets, {}, 5);
  EXPECT_GT(counts.min().item<int64_t>(), 100);
  EXPECT_FALSE(make_synthetic(100, 4, 3, 0.0, 1).test.has_value());
}

TEST(MakeSynthetic, DeterministicFromTheSeedAlone) {
  torch::manual_seed(123);
  const DataSplits a = make_synthetic(500, 8, 4, 0.1, 99);
  torch::manual_seed(456);  // torch's global state must not matter
  torch::randn({100});
  const DataSplits b = make_synthetic(500, 8, 4, 0.1, 99);
  EXPECT_TRUE(a.train.inputs.equal(b.train.inputs));
  EXPECT_TRUE(a.train.targets.equal(b.train.targets));
  EXPECT_TRUE(a.test->inputs.equal(b.test->inputs));
  const DataSplits c = make_synthetic(500, 8, 4, 0.1, 100);
  EXPECT_FALSE(a.train.inputs.equal(c.train.inputs));
}

TEST(MakeSynthetic, ClassesAreSeparated) {
  // Nearest-centroid on the training means must classify the test set well: the problem is
  // learnable (the model test trains an MLP on it).
  const DataSplits s = make_synthetic(4000, 32, 10, 0.25, 7);
  std::vector<at::Tensor> means;
  for (int64_t c = 0; c < 10; ++c) {
    means.push_back(s.train.inputs.index({s.train.targets == c}).mean(0));
  }
  const at::Tensor centroids = torch::stack(means);                 // [10, 32]
  const at::Tensor dist = torch::cdist(s.test->inputs, centroids);  // [1000, 10]
  const double acc = dist.argmin(1).eq(s.test->targets).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(acc, 0.95);
}

TEST(MakeSynthetic, BadArguments) {
  EXPECT_THROW(make_synthetic(1, 4, 2, 0.0, 0), InvalidArgument);
  EXPECT_THROW(make_synthetic(100, 0, 2, 0.0, 0), InvalidArgument);
  EXPECT_THROW(make_synthetic(100, 4, 1, 0.0, 0), InvalidArgument);
  EXPECT_THROW(make_synthetic(100, 4, 2, 1.0, 0), InvalidArgument);
  EXPECT_THROW(make_synthetic(2, 4, 2, 0.9, 0), InvalidArgument);
}

}  // namespace
}  // namespace krab::data
