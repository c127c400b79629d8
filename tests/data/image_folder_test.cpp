// Listing an image folder (images.h's scan_image_folder) beyond one flat folder per class:
// images in sub-folders belong to their class folder (as in torchvision's ImageFolder), in byte
// order of their path below it; an entry named like an image that cannot be read (a symbolic
// link to nothing, a FIFO) follows the rule of a damaged file, at load and lazily: named, or
// skipped and counted with skip_bad; symbolic-link loops, a folder linked twice and a tree
// deeper than kMaxImageFolderDepth are refused naming the folder.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "data/images.h"
#include "image_util.h"
#include "test_util.h"

namespace krab::data {
namespace {

namespace fs = std::filesystem;
using testing::expect_throw_containing;
using testing::make_pixels;
using testing::TempDir;
using testing::write_png;

ImageOptions options(bool lazy, bool skip_bad = false) {
  ImageOptions o;
  o.height = 4;
  o.width = 3;
  o.lazy = lazy;
  o.skip_bad = skip_bad;
  return o;
}

// A 4x3 grey PNG whose pixels are make_pixels(seed).
void image(const fs::path& path, int seed) {
  fs::create_directories(path.parent_path());
  write_png(path.string(), 4, 3, 1, make_pixels(seed, 4, 3, 1));
}

// The training tensors of either mode: decoded at load, or every example of the lazy split.
std::pair<at::Tensor, at::Tensor> examples(const DataSplits& s) {
  if (!s.lazy_train) return {s.train.inputs, s.train.targets};
  std::vector<int64_t> all(static_cast<size_t>(s.lazy_train->size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  return s.lazy_train->get(all);
}

TEST(ImageFolderListing, ImagesInSubFoldersBelongToTheirClassInPathOrder) {
  TempDir dir;
  const fs::path root = dir.path();
  image(root / "ant/z.png", 0);
  image(root / "ant/b/d/e.png", 1);
  image(root / "ant/a.png", 2);
  image(root / "ant/b/c.png", 3);
  image(root / "ant/.cache/hidden.png", 4);  // hidden at any depth
  std::ofstream(root / "ant/b/notes.txt") << "not an image";
  image(root / "bee/2021/x.png", 5);  // a class whose images are all in a sub-folder
  const ImageFolder f = scan_image_folder(root.string());
  EXPECT_EQ(f.classes, (std::vector<std::string>{"ant", "bee"}));
  const std::vector<std::string> want = {
      (root / "ant/a.png").string(), (root / "ant/b/c.png").string(),
      (root / "ant/b/d/e.png").string(), (root / "ant/z.png").string(),
      (root / "bee/2021/x.png").string()};
  EXPECT_EQ(f.files, want);
  EXPECT_EQ(f.labels, (std::vector<int64_t>{0, 0, 0, 0, 1}));
  // Their pixels, in that order, in both modes.
  const int seeds[] = {2, 3, 1, 0, 5};
  for (bool lazy : {false, true}) {
    const auto [x, y] = examples(load_images(root.string(), options(lazy)));
    ASSERT_EQ(x.size(0), 5) << "lazy " << lazy;
    for (int64_t e = 0; e < 5; ++e) {
      const at::Tensor expect =
          torch::from_blob(make_pixels(seeds[e], 4, 3, 1).data(), {1, 4, 3}, torch::kUInt8)
              .to(torch::kFloat32) /
          255.0;
      EXPECT_TRUE(torch::equal(x[e], expect)) << "example " << e << ", lazy " << lazy;
      EXPECT_EQ(y[e].item<int64_t>(), e < 4 ? 0 : 1);
    }
  }
}

// One rule for every image that cannot be read: a symbolic link to nothing (skipped without a
// word before) and a FIFO (which must not block the reader) are named like a damaged file, or
// skipped and counted with it under skip_bad, at load and lazily.
TEST(ImageFolderListing, ALinkToNothingOrAFifoIsUnreadableLikeADamagedFile) {
  TempDir dir;
  const fs::path root = dir.path();
  for (int i = 0; i < 3; ++i) image(root / "ant" / (std::to_string(i) + ".png"), i);
  image(root / "bee/0.png", 7);
  const std::string gone = (root / "ant/sub/gone.png").string();
  fs::create_directories(root / "ant/sub");
  fs::create_symlink(root / "nowhere.png", gone);
  for (bool lazy : {false, true}) {
    expect_throw_containing<InvalidArgument>(
        [&] { load_images(root.string(), options(lazy)); },
        {"image '" + gone + "' cannot be read: a symbolic link to a missing file",
         "data.skip_bad: true skips such files"});
  }
  fs::remove(gone);
  const std::string fifo = (root / "bee/pipe.jpg").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (bool lazy : {false, true}) {
    expect_throw_containing<InvalidArgument>(
        [&] { load_images(root.string(), options(lazy)); },
        {"image '" + fifo + "' cannot be read", "not a regular file", "data.skip_bad"});
  }
  fs::create_symlink(root / "nowhere.png", gone);
  std::ofstream(root / "ant/broken.png") << "not a picture";
  for (bool lazy : {false, true}) {
    int64_t skipped = 0;
    const DataSplits s = load_images(root.string(), options(lazy, /*skip_bad=*/true), &skipped);
    EXPECT_EQ(skipped, 3) << "lazy " << lazy;  // the link, the FIFO and the damaged file
    EXPECT_EQ(s.training().size(), 4) << "lazy " << lazy;
    EXPECT_TRUE(torch::equal(examples(s).second, torch::tensor({0, 0, 0, 1}))) << lazy;
  }
  // A link to an image is followed, as ImageFolder follows it.
  fs::remove(gone);
  fs::create_symlink(root / "ant/0.png", gone);
  fs::remove(fifo);
  fs::remove(root / "ant/broken.png");
  EXPECT_EQ(load_images(root.string(), options(false)).train.size(), 5);
}

TEST(ImageFolderListing, LinkLoopsFoldersLinkedTwiceAndDeepTreesAreRefused) {
  TempDir dir, elsewhere;
  const fs::path root = dir.path();
  image(root / "ant/a.png", 0);
  image(root / "bee/b.png", 1);
  const std::string root_text = "image folder '" + root.string() + "'";
  fs::create_directory_symlink(root / "ant", root / "ant/self");
  expect_throw_containing<InvalidArgument>(
      [&] { scan_image_folder(root.string()); },
      {root_text, "'" + (root / "ant/self").string() + "' is the folder '" +
                      (root / "ant").string() + "' again"});
  fs::remove(root / "ant/self");
  fs::create_directory_symlink(root, root / "bee/up");  // back to the root, through a class
  expect_throw_containing<InvalidArgument>([&] { scan_image_folder(root.string()); },
                                           {(root / "bee/up").string(), "again"});
  fs::remove(root / "bee/up");
  // The same folder linked from two classes would count its images twice.
  image(elsewhere.path() / "shared/s.png", 2);
  fs::create_directory_symlink(elsewhere.path() / "shared", root / "ant/more");
  EXPECT_EQ(scan_image_folder(root.string()).files.size(), 3u);  // a link to a folder is followed
  fs::create_directory_symlink(elsewhere.path() / "shared", root / "bee/more");
  expect_throw_containing<InvalidArgument>(
      [&] { scan_image_folder(root.string()); },
      {(root / "bee/more").string(), "is the folder '" + (root / "ant/more").string() + "' again"});
  fs::remove(root / "bee/more");
  // kMaxImageFolderDepth folders below the class folder are read; one more is refused.
  fs::path deep = root / "bee";
  for (int d = 0; d < kMaxImageFolderDepth; ++d) deep /= "d";
  image(deep / "deep.png", 3);
  EXPECT_EQ(scan_image_folder(root.string()).files.size(), 4u);
  image(deep / "d/deeper.png", 4);
  expect_throw_containing<InvalidArgument>(
      [&] { scan_image_folder(root.string()); },
      {(deep / "d").string(), "more than " + std::to_string(kMaxImageFolderDepth) + " folders"});
}

}  // namespace
}  // namespace krab::data
