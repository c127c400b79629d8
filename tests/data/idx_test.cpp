// IDX reading and the Fashion-MNIST loader: the real Debian files, and small files the tests
// write themselves (plain and gzipped) to exercise every check.
#include "data/idx.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "data/dataset.h"
#include "test_util.h"

namespace krab::data {
namespace {

using testing::expect_throw_containing;
using testing::TempDir;

const char* kDebianDir = "/usr/share/datasets/fashion-mnist";

// ---- crafted files -------------------------------------------------------------------------

void put_u32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
}

// An IDX image file: n images of rows x cols, pixel (i, r, c) = (i * 31 + r * 7 + c) % 256.
std::string image_bytes(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 2051) {
  std::string s;
  put_u32(s, magic);
  put_u32(s, n);
  put_u32(s, rows);
  put_u32(s, cols);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < cols; ++c)
        s.push_back(static_cast<char>((i * 31 + r * 7 + c) % 256));
  return s;
}

// An IDX label file: label i = i % 10 (or the given labels).
std::string label_bytes(uint32_t n, uint32_t magic = 2049) {
  std::string s;
  put_u32(s, magic);
  put_u32(s, n);
  for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Writes the four Fashion-MNIST files into `dir`, gzipped or plain.
void write_dataset(const TempDir& dir, bool gz, uint32_t n_train = 7, uint32_t n_test = 3,
                   uint32_t rows = 4, uint32_t cols = 5) {
  auto put = [&](const std::string& stem, const std::string& bytes) {
    if (gz) {
      write_gz(dir.file(stem + ".gz"), bytes);
    } else {
      write_plain(dir.file(stem), bytes);
    }
  };
  put("train-images-idx3-ubyte", image_bytes(n_train, rows, cols));
  put("train-labels-idx1-ubyte", label_bytes(n_train));
  put("t10k-images-idx3-ubyte", image_bytes(n_test, rows, cols));
  put("t10k-labels-idx1-ubyte", label_bytes(n_test));
}

void expect_crafted_values(const DataSplits& s, uint32_t n_train, uint32_t n_test) {
  ASSERT_EQ(s.train.inputs.sizes(), (std::vector<int64_t>{n_train, 1, 4, 5}));
  ASSERT_EQ(s.train.targets.sizes(), (std::vector<int64_t>{n_train}));
  ASSERT_TRUE(s.test.has_value());
  ASSERT_EQ(s.test->inputs.sizes(), (std::vector<int64_t>{n_test, 1, 4, 5}));
  EXPECT_EQ(s.input_shape, (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(s.num_classes, 10);
  EXPECT_FALSE(s.language_model);
  EXPECT_EQ(s.train.inputs.scalar_type(), torch::kFloat32);
  EXPECT_EQ(s.train.targets.scalar_type(), torch::kInt64);
  auto x = s.train.inputs.accessor<float, 4>();
  auto y = s.train.targets.accessor<int64_t, 1>();
  for (uint32_t i = 0; i < n_train; ++i) {
    EXPECT_EQ(y[i], i % 10);
    for (uint32_t r = 0; r < 4; ++r)
      for (uint32_t c = 0; c < 5; ++c)
        ASSERT_FLOAT_EQ(x[i][0][r][c], float((i * 31 + r * 7 + c) % 256) / 255.0f);
  }
}

TEST(IdxCrafted, PlainFilesParse) {
  TempDir dir;
  write_dataset(dir, /*gz=*/false);
  expect_crafted_values(load_fashion_mnist(dir.path().string(), false), 7, 3);
}

TEST(IdxCrafted, GzippedFilesParse) {
  TempDir dir;
  write_dataset(dir, /*gz=*/true, 12, 2);
  expect_crafted_values(load_fashion_mnist(dir.path().string(), false), 12, 2);
}

TEST(IdxCrafted, NormalizeStandardises) {
  TempDir dir;
  write_dataset(dir, false);
  const DataSplits raw = load_fashion_mnist(dir.path().string(), false);
  const DataSplits norm = load_fashion_mnist(dir.path().string(), true);
  EXPECT_TRUE(torch::allclose(norm.train.inputs, (raw.train.inputs - 0.2860) / 0.3530));
  EXPECT_TRUE(torch::allclose(norm.test->inputs, (raw.test->inputs - 0.2860) / 0.3530));
}

TEST(IdxCrafted, ReadIdxShape) {
  TempDir dir;
  write_gz(dir.file("x.gz"), image_bytes(2, 3, 6));
  const at::Tensor t = read_idx(dir.file("x.gz"), kIdxImagesMagic);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3, 6}));
  EXPECT_EQ(t.scalar_type(), torch::kUInt8);
  EXPECT_EQ(t[1][2][5].item<uint8_t>(), (31 + 14 + 5) % 256);
}

TEST(IdxCrafted, BadMagic) {
  for (bool gz : {false, true}) {
    TempDir dir;
    write_dataset(dir, gz);
    const std::string name = std::string("train-images-idx3-ubyte") + (gz ? ".gz" : "");
    // Label magic in an image file: a real IDX file, but of the wrong kind.
    const std::string bytes = image_bytes(7, 4, 5, 2049);
    gz ? write_gz(dir.file(name), bytes) : write_plain(dir.file(name), bytes);
    expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                         {name, "magic", "2049", "2051"});
  }
}

TEST(IdxCrafted, TruncatedPayload) {
  for (bool gz : {false, true}) {
    TempDir dir;
    write_dataset(dir, gz);
    const std::string name = std::string("t10k-images-idx3-ubyte") + (gz ? ".gz" : "");
    std::string bytes = image_bytes(3, 4, 5);
    bytes.resize(bytes.size() - 7);
    gz ? write_gz(dir.file(name), bytes) : write_plain(dir.file(name), bytes);
    expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                         {name, "truncated", "60", "53"});
  }
}

TEST(IdxCrafted, TruncatedHeader) {
  TempDir dir;
  write_dataset(dir, false);
  write_plain(dir.file("train-labels-idx1-ubyte"), label_bytes(7).substr(0, 6));
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-labels-idx1-ubyte", "truncated"});
}

TEST(IdxCrafted, TruncatedGzipStream) {
  // The compressed stream itself is cut short, not just the payload inside it.
  TempDir dir;
  write_dataset(dir, true, 200, 3);
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-images-idx3-ubyte.gz", "truncated"});
}

TEST(IdxCrafted, DamagedGzipStream) {
  TempDir dir;
  write_dataset(dir, true, 200, 3);
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(40);
  const char junk[16] = {'\xff', '\x00', '\x13', '\x37', '\xff', '\xff', '\x00', '\x01',
                         '\xaa', '\x55', '\xaa', '\x55', '\x00', '\x00', '\xff', '\xff'};
  f.write(junk, sizeof junk);
  f.close();
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-images-idx3-ubyte.gz"});
}

TEST(IdxCrafted, TrailingBytes) {
  TempDir dir;
  write_dataset(dir, false);
  write_plain(dir.file("t10k-labels-idx1-ubyte"), label_bytes(3) + "xyz");
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"t10k-labels-idx1-ubyte", "trailing"});
}

TEST(IdxCrafted, CountMismatch) {
  TempDir dir;
  write_dataset(dir, true);
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), label_bytes(6));
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-labels-idx1-ubyte.gz", "6 labels", "7 images"});
}

TEST(IdxCrafted, LabelOutOfRange) {
  TempDir dir;
  write_dataset(dir, false);
  std::string labels = label_bytes(7);
  labels[8 + 4] = 10;  // example 4
  write_plain(dir.file("train-labels-idx1-ubyte"), labels);
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-labels-idx1-ubyte", "label 10", "index 4"});
}

TEST(IdxCrafted, ZeroDimension) {
  TempDir dir;
  write_dataset(dir, false);
  write_plain(dir.file("train-images-idx3-ubyte"), image_bytes(7, 0, 5));
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-images-idx3-ubyte", "zero"});
}

// Dimensions whose product wraps around 2^64 ([2^17, 2^17, 2^30] = 2^64 -> 0) must not pass the
// size guard as an empty payload.
TEST(IdxCrafted, DimensionsWhoseProductWrapsAreRefused) {
  TempDir dir;
  write_dataset(dir, false);
  std::string header;
  put_u32(header, 2051);
  put_u32(header, 1u << 17);
  put_u32(header, 1u << 17);
  put_u32(header, 1u << 30);
  write_plain(dir.file("train-images-idx3-ubyte"), header);
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"train-images-idx3-ubyte", "implausible"});
}

TEST(IdxCrafted, TestImageSizeMismatch) {
  TempDir dir;
  write_dataset(dir, false);
  write_plain(dir.file("t10k-images-idx3-ubyte"), image_bytes(3, 5, 4));
  expect_throw_containing<CorruptData>([&] { load_fashion_mnist(dir.path().string(), false); },
                                       {"test images"});
}

TEST(IdxCrafted, MissingDirectory) {
  const std::string missing = "/nonexistent/krab/fashion";
  expect_throw_containing<InvalidArgument>([&] { load_fashion_mnist(missing, false); },
                                           {"dataset directory '" + missing + "' does not exist"});
}

TEST(IdxCrafted, MissingFile) {
  TempDir dir;
  write_dataset(dir, true);
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  expect_throw_containing<InvalidArgument>([&] { load_fashion_mnist(dir.path().string(), false); },
                                           {"t10k-labels-idx1-ubyte", "does not exist"});
}

// ---- the real dataset ----------------------------------------------------------------------
// Expected values were read from the raw bytes with Python's gzip module, independently of
// this reader: first labels 9,0,0,3 (train) and 9,2,1,1 (t10k); the first training image's
// bytes sum to 76247 and its pixel (14, 14) is 217; the mean of all training pixels is
// 0.28604 of full scale.

class RealFashionMnist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::is_directory(kDebianDir)) {
      raw_ = new DataSplits(load_fashion_mnist(kDebianDir, false));
    }
  }
  static void TearDownTestSuite() {
    delete raw_;
    raw_ = nullptr;
  }
  void SetUp() override {
    if (raw_ == nullptr) GTEST_SKIP() << kDebianDir << " not installed (dataset-fashion-mnist)";
  }
  static DataSplits* raw_;
};
DataSplits* RealFashionMnist::raw_ = nullptr;

TEST_F(RealFashionMnist, SizesAndShapes) {
  const DataSplits& s = *raw_;
  EXPECT_EQ(s.train.size(), 60000);
  ASSERT_TRUE(s.test.has_value());
  EXPECT_EQ(s.test->size(), 10000);
  EXPECT_EQ(s.train.inputs.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(s.test->inputs.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(s.input_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(s.num_classes, 10);
  EXPECT_FALSE(s.language_model);
}

TEST_F(RealFashionMnist, LabelsMatchRawBytes) {
  const DataSplits& s = *raw_;
  EXPECT_EQ(s.train.targets.min().item<int64_t>(), 0);
  EXPECT_EQ(s.train.targets.max().item<int64_t>(), 9);
  EXPECT_EQ(s.test->targets.max().item<int64_t>(), 9);
  EXPECT_TRUE(s.train.targets.narrow(0, 0, 4).equal(torch::tensor({9, 0, 0, 3}, torch::kInt64)));
  EXPECT_TRUE(s.test->targets.narrow(0, 0, 4).equal(torch::tensor({9, 2, 1, 1}, torch::kInt64)));
  // Fashion-MNIST is balanced: 6000 of each class in train.
  const at::Tensor counts = torch::bincount(s.train.targets);
  EXPECT_TRUE(counts.equal(torch::full({10}, 6000, torch::kInt64)));
}

TEST_F(RealFashionMnist, PixelsMatchRawBytes) {
  const at::Tensor first = raw_->train.inputs[0][0];
  EXPECT_NEAR(first.sum().item<double>(), 76247.0 / 255.0, 1e-3);
  EXPECT_FLOAT_EQ(first[14][14].item<float>(), 217.0f / 255.0f);
  EXPECT_GE(raw_->train.inputs.min().item<float>(), 0.0f);
  EXPECT_LE(raw_->train.inputs.max().item<float>(), 1.0f);
  EXPECT_NEAR(raw_->train.inputs.mean().item<double>(), 0.28604, 1e-4);
}

TEST_F(RealFashionMnist, NormalizedHasZeroMeanUnitStd) {
  const DataSplits norm = load_fashion_mnist(kDebianDir, true);
  EXPECT_NEAR(norm.train.inputs.mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(norm.train.inputs.std().item<double>(), 1.0, 1e-3);
}

}  // namespace
}  // namespace krab::data
