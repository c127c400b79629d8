// Image folders: PNG/JPEG decoding, resizing, labels from sorted folder names, normalisation,
// augmentation, bad input, and the batch prefetcher. The test writes its own images with
// libpng and libjpeg.
#include "data/images.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "data/image_codec.h"
#include "data/prefetch.h"
#include "image_util.h"
#include "test_util.h"

namespace krab::data {
namespace {

namespace fs = std::filesystem;
using testing::expect_throw_containing;
using testing::make_pixels;
using testing::pixel;
using testing::TempDir;
using testing::write_jpeg;
using testing::write_png;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// 3 classes x 4 grey 6x5 PNGs, folders created out of order; image seed = class * 4 + i, where
// class is the sorted position ("ant" 0, "moth" 1, "zebra" 2).
void write_folder(const fs::path& root, int h = 6, int w = 5) {
  const char* names[] = {"zebra", "ant", "moth"};
  const int sorted_pos[] = {2, 0, 1};
  for (int n = 0; n < 3; ++n) {
    fs::create_directories(root / names[n]);
    for (int i = 0; i < 4; ++i) {
      const int seed = sorted_pos[n] * 4 + i;
      write_png((root / names[n] / ("img" + std::to_string(i) + ".png")).string(), h, w, 1,
                make_pixels(seed, h, w, 1));
    }
  }
}

ImageOptions options(int64_t h, int64_t w) {
  ImageOptions o;
  o.height = h;
  o.width = w;
  return o;
}

TEST(ImageFolder, LabelsFromSortedNamesShapesAndExactPixels) {
  TempDir dir;
  write_folder(dir.path());
  int64_t skipped = -1;
  const DataSplits s = load_images(dir.path().string(), options(6, 5), &skipped);
  EXPECT_EQ(skipped, 0);
  EXPECT_EQ(s.num_classes, 3);
  EXPECT_EQ(s.input_shape, (std::vector<int64_t>{1, 6, 5}));
  ASSERT_EQ(s.train.inputs.sizes(), (c10::IntArrayRef{12, 1, 6, 5}));
  EXPECT_FALSE(s.test.has_value());
  for (int64_t e = 0; e < 12; ++e) {
    EXPECT_EQ(s.train.targets[e].item<int64_t>(), e / 4);
    // Identity size: exactly the written pixels / 255 (mean 0, std 1).
    auto expect =
        torch::from_blob(make_pixels(static_cast<int>(e), 6, 5, 1).data(), {1, 6, 5}, torch::kUInt8)
            .to(torch::kFloat32) /
        255.0;
    EXPECT_TRUE(torch::equal(s.train.inputs[e], expect)) << "example " << e;
  }
  const ImageFolder f = scan_image_folder(dir.path().string());
  EXPECT_EQ(f.classes, (std::vector<std::string>{"ant", "moth", "zebra"}));
}

TEST(ImageFolder, RgbJpegAndPerChannelNormalisation) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  fs::create_directories(dir.path() / "b");
  write_png(dir.file("a/x.png"), 4, 4, 3, make_pixels(1, 4, 4, 3));
  write_jpeg(dir.file("b/y.JPG"), 8, 8, 3, make_pixels(2, 8, 8, 3));
  ImageOptions o = options(4, 4);
  o.mean = {0.5, 0.25, 0.0};
  o.std = {0.5, 2.0, 1.0};
  const DataSplits s = load_images(dir.path().string(), o);
  ASSERT_EQ(s.train.inputs.sizes(), (c10::IntArrayRef{2, 3, 4, 4}));
  EXPECT_EQ(s.train.targets[1].item<int64_t>(), 1);
  const float v = pixel(1, 2, 3, 1) / 255.0f;
  EXPECT_FLOAT_EQ(s.train.inputs[0][1][2][3].item<float>(), (v - 0.25f) / 2.0f);
  // The 8x8 JPEG (quality 100) halved: the mean of each 2x2 block, up to JPEG's rounding.
  const std::vector<uint8_t> p = make_pixels(2, 8, 8, 3);
  const float block =
      (p[(2 * 8 + 2) * 3] + p[(2 * 8 + 3) * 3] + p[(3 * 8 + 2) * 3] + p[(3 * 8 + 3) * 3]) / 4.0f /
      255.0f;
  EXPECT_NEAR(s.train.inputs[1][0][1][1].item<float>() * 0.5f + 0.5f, block, 0.03);
}

TEST(ImageCodec, BilinearMatchesTorchInterpolate) {
  Image img{3, 4, 1, make_pixels(5, 3, 4, 1)};
  auto src =
      torch::from_blob(img.pixels.data(), {1, 1, 3, 4}, torch::kUInt8).to(torch::kFloat32) / 255.0;
  for (auto [h, w] : {std::pair<int64_t, int64_t>{7, 9}, {2, 2}, {3, 8}}) {
    auto want = torch::upsample_bilinear2d(src, {h, w}, false)[0];
    EXPECT_TRUE(torch::allclose(image_to_tensor(img, h, w), want, 1e-5, 1e-6)) << h << "x" << w;
  }
}

TEST(ImageCodec, GreyAndRgbConversions) {
  TempDir dir;
  write_png(dir.file("g.png"), 2, 2, 1, {10, 20, 30, 40});
  const Image rgb = decode_image_file(dir.file("g.png"), 3);
  EXPECT_EQ(rgb.channels, 3);
  EXPECT_EQ(rgb.pixels[3 * 3 + 2], 40);
  write_png(dir.file("c.png"), 1, 1, 3, {255, 0, 0});
  EXPECT_EQ(decode_image_file(dir.file("c.png"), 1).pixels[0], 76);  // 0.299 * 255, rounded
}

TEST(ImageFolder, UnreadableImageIsNamedOrSkippedAndCounted) {
  TempDir dir;
  write_folder(dir.path());
  const std::string bad = dir.file("moth/broken.png");
  write_bytes(bad, "this is not a picture");
  expect_throw_containing<InvalidArgument>([&] { load_images(dir.path().string(), options(6, 5)); },
                                           {bad, "cannot be read"});
  // A truncated PNG: the right magic, then nothing.
  write_bytes(bad, std::string("\x89PNG\r\n\x1a\n\0\0", 10));
  expect_throw_containing<InvalidArgument>([&] { load_images(dir.path().string(), options(6, 5)); },
                                           {bad, "PNG"});
  ImageOptions o = options(6, 5);
  o.skip_bad = true;
  int64_t skipped = 0;
  const DataSplits s = load_images(dir.path().string(), o, &skipped);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(s.train.size(), 12);
  EXPECT_EQ(s.train.targets[4].item<int64_t>(), 1);  // moth's images kept their label
}

TEST(ImageFolder, EmptyOrMissingFoldersNameThePath) {
  TempDir dir;
  const std::string root = dir.path().string();
  expect_throw_containing<InvalidArgument>([&] { load_images(root, options(4, 4)); },
                                           {root, "no class folders"});
  expect_throw_containing<InvalidArgument>([&] { load_images(root + "/nope", options(4, 4)); },
                                           {root + "/nope", "does not exist"});
  fs::create_directories(dir.path() / "cls");
  write_bytes(dir.file("cls/readme.txt"), "x");
  expect_throw_containing<InvalidArgument>([&] { load_images(root, options(4, 4)); },
                                           {dir.file("cls"), "no .png"});
}

TEST(ImageFolder, TestSplitUsesTrainingClasses) {
  TempDir train, test;
  write_folder(train.path());
  fs::create_directories(test.path() / "zebra");
  write_png(test.file("zebra/z.png"), 6, 5, 1, make_pixels(0, 6, 5, 1));
  ImageOptions o = options(6, 5);
  o.test_path = test.path().string();
  const DataSplits s = load_images(train.path().string(), o);
  ASSERT_TRUE(s.test.has_value());
  EXPECT_EQ(s.test->targets[0].item<int64_t>(), 2);
  fs::create_directories(test.path() / "yak");
  write_png(test.file("yak/y.png"), 6, 5, 1, make_pixels(0, 6, 5, 1));
  expect_throw_containing<InvalidArgument>([&] { load_images(train.path().string(), o); },
                                           {"'yak'", "not one of the training classes"});
}

TEST(ImageOptionsParsing, SizeAndLists) {
  EXPECT_EQ(parse_image_size("28x28"), (std::pair<int64_t, int64_t>{28, 28}));
  EXPECT_EQ(parse_image_size("[32, 24]"), (std::pair<int64_t, int64_t>{32, 24}));
  EXPECT_EQ(parse_image_size("16"), (std::pair<int64_t, int64_t>{16, 16}));
  expect_throw_containing<InvalidArgument>([] { parse_image_size(""); }, {"data.size"});
  expect_throw_containing<InvalidArgument>([] { parse_image_size("2.5x3"); }, {"data.size"});
  expect_throw_containing<InvalidArgument>([] { parse_image_size("1,2,3"); }, {"data.size"});
  EXPECT_EQ(parse_number_list("0.5, 0.25,1", "data.mean"), (std::vector<double>{0.5, 0.25, 1}));
  expect_throw_containing<InvalidArgument>([] { parse_number_list("a", "data.std"); },
                                           {"data.std", "'a'"});
  TempDir dir;
  write_folder(dir.path());
  ImageOptions o = options(6, 5);
  o.mean = {0.1, 0.2};
  expect_throw_containing<InvalidArgument>([&] { load_images(dir.path().string(), o); },
                                           {"data.mean", "2 values", "1 channels"});
}

TEST(Augment, DeterministicPerSeedEpochAndIndex) {
  ImageOptions o = options(6, 5);
  o.random_crop = 2;
  o.random_flip = true;
  const at::Tensor base = torch::arange(2 * 1 * 6 * 5, torch::kFloat32).reshape({2, 1, 6, 5});
  auto run = [&](std::vector<int64_t> idx, uint64_t seed, int64_t epoch) {
    at::Tensor x = base.clone();
    augment_images(x, idx, seed, epoch, o);
    return x;
  };
  const at::Tensor a = run({7, 9}, 1, 0);
  EXPECT_TRUE(torch::equal(a, run({7, 9}, 1, 0)));
  // Example 9 gets the same crop in another batch position (it depends on its index only).
  at::Tensor swapped = base.flip({0}).clone();
  augment_images(swapped, {9, 7}, 1, 0, o);
  EXPECT_TRUE(torch::equal(swapped[0], a[1]));
  // Across 20 epochs the crops differ, and every output is a shifted window of the input.
  int differ = 0;
  for (int64_t e = 1; e < 20; ++e) differ += !torch::equal(run({7, 9}, 1, e), a);
  EXPECT_GT(differ, 10);
  ImageOptions none = options(6, 5);
  at::Tensor x = base.clone();
  augment_images(x, {0, 1}, 1, 0, none);
  EXPECT_TRUE(torch::equal(x, base));
  // A flip alone mirrors or keeps each image.
  ImageOptions flip = options(6, 5);
  flip.random_flip = true;
  int flipped = 0;
  for (int64_t e = 0; e < 16; ++e) {
    at::Tensor y = base.clone();
    augment_images(y, {0, 1}, 3, e, flip);
    const bool same = torch::equal(y[0], base[0]);
    EXPECT_TRUE(same || torch::equal(y[0], base[0].flip({2})));
    flipped += !same;
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 16);
}

TEST(Prefetcher, SameBatchesAsDirectAndRecoversFromWrongGuesses) {
  GlobalBatchSampler sampler(100, 10, 4);
  auto plan = [&](int64_t step, BatchSlice part) { return sampler.slice(step, part); };
  std::atomic<int> made{0};
  auto produce = [&](int64_t step, const std::vector<int64_t>& idx) {
    ++made;
    return BatchPrefetcher::Batch{torch::tensor(idx), torch::full({1}, step)};
  };
  BatchPrefetcher pf(plan, produce, 2, 3, 30);
  for (int64_t s = 0; s < 30; ++s) {
    const BatchSlice part = s < 20 ? BatchSlice{0, 5} : BatchSlice{5, 10};  // a change at 20
    auto [x, y] = pf.get(s, part);
    GlobalBatchSampler fresh(100, 10, 4);
    EXPECT_TRUE(torch::equal(x, torch::tensor(fresh.slice(s, part)))) << "step " << s;
    EXPECT_EQ(y.item<int64_t>(), s);
  }
  EXPECT_GE(made.load(), 30);
  EXPECT_GE(pf.waited_seconds(), 0.0);
}

TEST(Prefetcher, BackgroundErrorsReachTheCaller) {
  auto plan = [](int64_t step, BatchSlice) { return std::vector<int64_t>{step}; };
  auto produce = [](int64_t step, const std::vector<int64_t>&) -> BatchPrefetcher::Batch {
    if (step == 2) throw InvalidArgument("image 'bad.png' cannot be read");
    return {torch::zeros({1}), torch::zeros({1})};
  };
  BatchPrefetcher pf(plan, produce, 1, 4, 10);
  pf.get(0, {0, 1});
  pf.get(1, {0, 1});
  expect_throw_containing<InvalidArgument>([&] { pf.get(2, {0, 1}); }, {"bad.png"});
}

}  // namespace
}  // namespace krab::data
