// Image folders: PNG/JPEG decoding, resizing, labels from sorted folder names, normalisation,
// augmentation, bad input, the lazily decoded training split (header checks at listing, damaged
// files found when decoded, the cache), and the batch prefetcher. The test writes its own images
// with libpng and libjpeg.
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
using testing::damage_png_pixels;
using testing::expect_throw_containing;
using testing::jpeg_stating;
using testing::make_pixels;
using testing::pixel;
using testing::png_stating;
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

// --- lazily decoded training split ---------------------------------------------------------------

ImageOptions lazy(ImageOptions o) {
  o.lazy = true;
  return o;
}

const ImageFolderDataset& lazy_split(const DataSplits& s) {
  const auto* images = dynamic_cast<const ImageFolderDataset*>(s.lazy_train.get());
  EXPECT_NE(images, nullptr);
  return *images;
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  return idx;
}

TEST(LazyImages, SameTensorsAsDecodedAtLoadAndAsTheCodec) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  fs::create_directories(dir.path() / "b");
  write_png(dir.file("a/grey.png"), 6, 5, 1, make_pixels(1, 6, 5, 1));
  write_png(dir.file("a/rgb.png"), 3, 7, 3, make_pixels(2, 3, 7, 3));
  write_jpeg(dir.file("b/photo.jpg"), 8, 8, 3, make_pixels(3, 8, 8, 3));
  write_jpeg(dir.file("b/small.jpeg"), 2, 3, 1, make_pixels(4, 2, 3, 1));
  ImageOptions o = options(4, 5);
  o.channels = 3;  // the first image is grey
  o.mean = {0.5, 0.25, 0.0};
  o.std = {0.5, 2.0, 1.0};
  const DataSplits eager = load_images(dir.path().string(), o);
  const DataSplits s = load_images(dir.path().string(), lazy(o));
  EXPECT_EQ(s.train.size(), 0);  // nothing decoded into memory
  EXPECT_EQ(s.input_shape, eager.input_shape);
  EXPECT_EQ(s.num_classes, 2);
  const ImageFolderDataset& images = lazy_split(s);
  ASSERT_EQ(images.size(), 4);
  const auto [x, y] = images.get({3, 0, 2, 1, 0});
  const std::vector<int64_t> order{3, 0, 2, 1, 0};
  for (size_t r = 0; r < order.size(); ++r) {
    const int64_t e = order[r];
    EXPECT_TRUE(torch::equal(x[r], eager.train.inputs[e])) << "example " << e;
    EXPECT_EQ(y[r].item<int64_t>(), eager.train.targets[e].item<int64_t>());
    // Independently: the codec's pixels as 3 channels, then (v - m) / s.
    at::Tensor want = image_to_tensor(decode_image_file(images.folder().files[e], 3), 4, 5);
    for (int c = 0; c < 3; ++c) want[c] = (want[c] - o.mean[c]) / o.std[c];
    EXPECT_TRUE(torch::allclose(x[r], want, 0, 1e-6)) << "example " << e;
  }
}

TEST(LazyImages, TestSplitIsReadAtEvaluationWithTheSameTensorsOnAnyThreads) {
  TempDir train, test;
  write_folder(train.path());
  write_folder(test.path());
  ImageOptions o = options(6, 5);
  o.test_path = test.path().string();
  o.cache_mb = 64;
  const DataSplits eager = load_images(train.path().string(), o);
  ASSERT_TRUE(eager.test.has_value());
  for (const int64_t threads : {1, 3}) {
    o.threads = threads;
    const DataSplits s = load_images(train.path().string(), lazy(o));
    EXPECT_FALSE(s.test.has_value());  // nothing decoded into memory
    ASSERT_NE(s.lazy_test, nullptr);
    ASSERT_EQ(s.testing(), s.lazy_test.get());
    const auto* images = dynamic_cast<const ImageFolderDataset*>(s.lazy_test.get());
    ASSERT_NE(images, nullptr);
    EXPECT_EQ(images->resident_bytes(), 0);  // no cache: evaluation reads it in order once
    const auto [x, y] = s.lazy_test->get(all_indices(s.lazy_test->size()));
    EXPECT_TRUE(torch::equal(x, eager.test->inputs)) << threads << " thread(s)";
    EXPECT_TRUE(torch::equal(y, eager.test->targets)) << threads << " thread(s)";
    EXPECT_TRUE(torch::equal(images->targets(), eager.test->targets));
  }
  // An unreadable test image fails on the caller's thread, named, whichever thread met it.
  damage_png_pixels(test.file("zebra/img3.png"));
  o.threads = 3;
  const DataSplits s = load_images(train.path().string(), lazy(o));
  expect_throw_containing<InvalidArgument>(
      [&] { s.lazy_test->get(all_indices(s.lazy_test->size())); },
      {test.file("zebra/img3.png"), "cannot be read"});
}

TEST(LazyImages, ListingChecksHeadersButDecodesNothing) {
  TempDir dir;
  write_folder(dir.path());
  const std::string bad = dir.file("moth/broken.png");
  write_png(bad, 6, 5, 1, make_pixels(0, 6, 5, 1));
  damage_png_pixels(bad);
  // Decoded at load the damage is found; listed lazily it is not (the header is sound).
  expect_throw_containing<InvalidArgument>([&] { load_images(dir.path().string(), options(6, 5)); },
                                           {bad, "PNG"});
  EXPECT_EQ(lazy_split(load_images(dir.path().string(), lazy(options(6, 5)))).size(), 13);
  // What the header check catches at listing, named or skipped like a decoding failure.
  const std::pair<std::string, std::string> cases[] = {
      {"this is not a picture", "neither a PNG nor a JPEG"},
      {std::string("\x89PNG\r\n\x1a\n\0\0", 10), "PNG"},
      {std::string("\xFF\xD8\xFF\xE0\0\x10JFIF", 10), "JPEG"},
      {"", "empty"}};
  for (const auto& [bytes, why] : cases) {
    write_bytes(bad, bytes);
    expect_throw_containing<InvalidArgument>(
        [&] { load_images(dir.path().string(), lazy(options(6, 5))); },
        {bad, "cannot be read", why, "data.skip_bad"});
  }
  // A PNG cut short after its header (no IEND trailer: decoded whole to tell) is refused; one
  // with bytes after its IEND chunk, which libpng ignores, is not.
  write_png(bad, 6, 5, 1, make_pixels(0, 6, 5, 1));
  const auto whole = fs::file_size(bad);
  fs::resize_file(bad, whole - 20);
  expect_throw_containing<InvalidArgument>(
      [&] { load_images(dir.path().string(), lazy(options(6, 5))); }, {bad, "PNG"});
  write_png(bad, 6, 5, 1, make_pixels(0, 6, 5, 1));
  std::ofstream(bad, std::ios::binary | std::ios::app) << "trailing bytes";
  EXPECT_EQ(lazy_split(load_images(dir.path().string(), lazy(options(6, 5)))).size(), 13);
  write_bytes(bad, "this is not a picture");
  ImageOptions o = lazy(options(6, 5));
  o.skip_bad = true;
  int64_t skipped = 0;
  const DataSplits s = load_images(dir.path().string(), o, &skipped);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(lazy_split(s).size(), 12);
  ImageOptions eager = options(6, 5);
  eager.skip_bad = true;
  EXPECT_TRUE(
      torch::equal(lazy_split(s).targets(), load_images(dir.path().string(), eager).train.targets))
      << "the same 12 examples as decoded at load";
}

// A few dozen bytes can state 65535 x 65535 pixels (4.4 GB resident before a decode error); the
// sizes here are just past the default limit of 4096 x 4096, so that the reader of the commit
// before the limit (which believed them) allocated tens of megabytes, not gigabytes, on its way
// to failing these checks.
TEST(ImageBombs, ImagesStatingMorePixelsThanTheLimitAreRefusedByTheirHeader) {
  TempDir dir;
  ASSERT_EQ(kDefaultMaxPixels, 4096 * 4096);
  const std::string file = dir.file("bomb.img");
  const std::string bombs[] = {png_stating(4097, 4097, true), png_stating(4097, 4097, false),
                               jpeg_stating(4097, 4097)};
  for (const std::string& bytes : bombs) {
    SCOPED_TRACE(bytes.size());
    ASSERT_LT(bytes.size(), 1024u);
    write_bytes(file, bytes);
    for (const bool probe : {true, false})
      expect_throw_containing<InvalidArgument>(
          [&] { probe ? (void)probe_image_file(file) : (void)decode_image_file(file); },
          {file, "4097x4097", "16785409 pixels", "data.max_pixels (16777216)"});
  }
  // At the limit the header passes (what its pixels hold is the decoder's business).
  write_bytes(file, png_stating(4096, 4096, true));
  EXPECT_EQ(probe_image_file(file).width, 4096);
  write_bytes(file, jpeg_stating(4096, 4096));
  EXPECT_EQ(probe_image_file(file).height, 4096);
}

// Every way in refuses them by name before pixels are decoded: the header check at listing
// (lazy), and the decoder of a split decoded at load and of the first image's channels.
TEST(ImageBombs, AFolderWithABombIsRefusedNamingItLazilyAndAtLoad) {
  TempDir dir;
  write_folder(dir.path());
  const std::string bomb = dir.file("ant/bomb.png");
  write_bytes(bomb, png_stating(4097, 4097, true));
  for (const bool lazily : {true, false})
    expect_throw_containing<InvalidArgument>(
        [&] { load_images(dir.path().string(), lazily ? lazy(options(6, 5)) : options(6, 5)); },
        {bomb, "4097x4097", "data.max_pixels", "data.skip_bad"});
  ImageOptions o = lazy(options(6, 5));
  o.skip_bad = true;  // a bomb is an unreadable file like any other
  int64_t skipped = 0;
  EXPECT_EQ(lazy_split(load_images(dir.path().string(), o, &skipped)).size(), 12);
  EXPECT_EQ(skipped, 1);
}

TEST(LazyImages, DamagedPixelsAreNamedOrReplacedWhenFirstDecoded) {
  TempDir dir;
  write_folder(dir.path());
  // Example 4 (sorted before moth's img0) and the last example, zebra/img3 (12), are damaged.
  const std::string bad = dir.file("moth/broken.png"), last = dir.file("zebra/img3.png");
  write_png(bad, 6, 5, 1, make_pixels(0, 6, 5, 1));
  damage_png_pixels(bad);
  damage_png_pixels(last);
  const DataSplits named = load_images(dir.path().string(), lazy(options(6, 5)));
  EXPECT_EQ(named.lazy_train->get({0, 5, 11}).first.size(0), 3);
  expect_throw_containing<InvalidArgument>(
      [&] {
        named.lazy_train->get({0, 4});
      },
      {bad, "cannot be read", "data.skip_bad"});

  ImageOptions o = lazy(options(6, 5));
  o.skip_bad = true;
  std::vector<std::string> notes;
  o.note = [&](const std::string& line) { notes.push_back(line); };
  const DataSplits s = load_images(dir.path().string(), o);
  const ImageFolderDataset& images = lazy_split(s);
  ImageOptions in_memory = o;
  in_memory.lazy = false;
  const DataSplits eager = load_images(dir.path().string(), in_memory);  // skips both: 11 left
  ASSERT_EQ(eager.train.size(), 11);
  // 4 becomes the next readable example, 5 (moth img0 = eager's 4); 12 wraps round to 0.
  const auto [x, y] = images.get({4, 12, 4, 5});
  EXPECT_TRUE(torch::equal(x[0], eager.train.inputs[4]));
  EXPECT_EQ(y[0].item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(x[1], eager.train.inputs[0]));
  EXPECT_EQ(y[1].item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(x[2], x[0]));
  EXPECT_TRUE(torch::equal(x[3], x[0]));
  EXPECT_EQ(images.replaced(), 2);
  ASSERT_EQ(notes.size(), 2u);  // once per file, however often it is drawn
  EXPECT_NE(notes[0].find(bad), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("example 4 uses"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find(last), std::string::npos) << notes[1];
  images.get({12, 4});
  EXPECT_EQ(notes.size(), 2u);
}

TEST(LazyImages, CacheIsBoundedByCacheMbAndChangesNoNumber) {
  TempDir dir;
  write_folder(dir.path());
  ImageOptions o = lazy(options(256, 256));  // 256 KiB a decoded image: 4 fit in 1 MiB
  const DataSplits none = load_images(dir.path().string(), o);
  o.cache_mb = 1;
  const DataSplits cached = load_images(dir.path().string(), o);
  const ImageFolderDataset& a = lazy_split(none);
  const ImageFolderDataset& b = lazy_split(cached);
  EXPECT_EQ(a.resident_bytes(), 0);
  EXPECT_EQ(b.resident_bytes(), 4 * 256 * 256 * 4);
  const std::vector<int64_t> idx = all_indices(12);
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_TRUE(torch::equal(a.get(idx).first, b.get(idx).first)) << "pass " << pass;
    EXPECT_EQ(a.cached_bytes(), 0);
    EXPECT_EQ(b.cached_bytes(), 4 * 256 * 256 * 4);
  }
  // The last four are the ones kept: asked again, they equal a fresh decode.
  EXPECT_TRUE(torch::equal(b.get({8, 9, 10, 11}).first, a.get({8, 9, 10, 11}).first));
}

// The batches the trainer gets: the same for 1 or 3 decoding threads, and the same as the
// dataset's examples augmented on the calling thread, over several epochs and a slice change.
TEST(LazyImages, PrefetchedBatchesDoNotDependOnThreads) {
  TempDir dir;
  write_folder(dir.path());
  ImageOptions o = lazy(options(6, 5));
  o.random_crop = 1;
  o.random_flip = true;
  const DataSplits s = load_images(dir.path().string(), o);
  const GlobalBatchSampler sampler(12, 4, 7);
  o.threads = 1;
  auto one = prefetch_image_batches(s.lazy_train, sampler, o, 7, 14);
  o.threads = 3;
  auto three = prefetch_image_batches(s.lazy_train, sampler, o, 7, 14);
  for (int64_t step = 0; step < 14; ++step) {
    const BatchSlice part = step < 9 ? BatchSlice{0, 4} : BatchSlice{2, 4};
    const auto [x1, y1] = one->get(step, part);
    const auto [x3, y3] = three->get(step, part);
    const std::vector<int64_t> idx = sampler.slice(step, part);
    auto [want, labels] = s.lazy_train->get(idx);
    augment_images(want, idx, 7, step / sampler.steps_per_epoch(), o);
    EXPECT_TRUE(torch::equal(x1, x3)) << "step " << step;
    EXPECT_TRUE(torch::equal(x1, want)) << "step " << step;
    EXPECT_TRUE(torch::equal(y1, y3) && torch::equal(y1, labels)) << "step " << step;
  }
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
