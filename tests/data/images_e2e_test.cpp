// `krab train` on an image folder, end to end: trains on 2 workers with augmentation and reports
// the data wait; 2 workers x 8 and 1 worker x 16 end with the same loss (the random crops and
// flips depend on the example, not on who draws it); an unreadable image stops the job before
// training with exit 2 and one line naming the file, or is skipped and counted (in one line,
// once per job) with data.skip_bad; one whose header is sound but whose pixels are damaged is found
// by the first batch that decodes it (exit 2 naming it, or replaced and said with data.skip_bad).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "image_util.h"
#include "test_util.h"

namespace krab::data {
namespace {

namespace fs = std::filesystem;
using testing::damage_png_pixels;
using testing::make_pixels;
using testing::TempDir;
using testing::write_png;

const std::string kKrab = std::string(KRAB_BINARY_DIR) + "/bin/krab";

struct Result {
  int code = -1;
  std::string output;
};

// Runs `cmd` under sh (stderr merged), bounded by `timeout` seconds.
Result run(const std::string& cmd, int timeout = 240) {
  Result r;
  const std::string full = "timeout -k 5 " + std::to_string(timeout) + " " + cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class ImagesE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int k = 0; k < 3; ++k) {
      const fs::path cls = dir_.path() / "train" / ("class" + std::to_string(k));
      fs::create_directories(cls);
      for (int i = 0; i < 16; ++i)
        write_png((cls / (std::to_string(i) + ".png")).string(), 8, 8, 1,
                  make_pixels(k * 16 + i, 8, 8, 1));
    }
    std::ofstream(dir_.file("job.yaml")) << "model: {name: mlp, hidden: 16}\n"
                                            "data: {name: images, size: 8x8, mean: 0.5, std: 0.25,"
                                            " random_crop: 2, random_flip: true}\n"
                                            "train: {steps: 6, optimizer: {name: sgd, lr: 0.05}}\n"
                                            "comm: {timeout_s: 30}\n";
  }

  Result train(int workers, int batch, const std::string& tag, const std::string& extra = "") {
    return run(kKrab + " train " + dir_.file("job.yaml") + " --set data.path=" +
               dir_.file("train") + " --set checkpoint.dir=" + dir_.file("runs-" + tag) +
               " --set parallel.workers=" + std::to_string(workers) + " --set data.batch_size=" +
               std::to_string(batch) + " --report " + dir_.file(tag + ".json") + " " + extra);
  }

  nlohmann::json report(const std::string& tag) {
    std::ifstream in(dir_.file(tag + ".json"));
    return nlohmann::json::parse(in);
  }

  TempDir dir_;
};

TEST_F(ImagesE2E, TrainsWithAugmentationAndTheSameLossOnOneOrTwoWorkers) {
  // The training folder doubles as the test split, read at evaluation a batch at a time: each of
  // two workers decodes half of it, one worker all of it.
  const std::string test = "--set data.test_path=" + dir_.file("train");
  const Result two = train(2, 8, "two", test);
  ASSERT_EQ(two.code, 0) << two.output;
  const Result one = train(1, 16, "one", test + " --set data.decode_threads=1");
  ASSERT_EQ(one.code, 0) << one.output;
  const nlohmann::json a = report("two"), b = report("one");
  ASSERT_TRUE(a.contains("data_wait_fraction")) << a.dump();
  EXPECT_GE(a["data_wait_fraction"].get<double>(), 0.0);
  EXPECT_LE(a["data_wait_fraction"].get<double>(), 1.0);
  const double la = a["final_loss"].get<double>(), lb = b["final_loss"].get<double>();
  EXPECT_LE(std::abs(la - lb), 1e-5 * std::abs(lb)) << la << " vs " << lb;
  ASSERT_TRUE(a.contains("test_accuracy")) << a.dump();
  EXPECT_EQ(a["test_accuracy"].get<double>(), b["test_accuracy"].get<double>());
  EXPECT_GT(a["test_accuracy"].get<double>(), 0.0);
}

TEST_F(ImagesE2E, UnreadableImageIsNamedOrSkipped) {
  const std::string bad = dir_.file("train/class1/broken.png");
  std::ofstream(bad) << "not an image";
  const Result r = train(2, 8, "bad");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data.skip_bad"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("bad.json")));
  EXPECT_FALSE(fs::exists(dir_.file("runs-bad")));

  // A symbolic link to nothing in a sub-folder is an unreadable image too (it was skipped
  // without a word, and sub-folders were not read): skipped and counted with the damaged file.
  // The count is said once, not by the launcher's check and then by each worker.
  fs::create_directories(dir_.file("train/class2/more"));
  fs::create_symlink(dir_.file("nowhere.png"), dir_.file("train/class2/more/gone.png"));
  const Result skipped = train(2, 8, "skip", "--set data.skip_bad=true");
  EXPECT_EQ(skipped.code, 0) << skipped.output;
  const std::string line =
      "krab: data.skip_bad: skipped 2 unreadable image(s) under '" + dir_.file("train") + "'\n";
  size_t said = 0;
  for (size_t at = skipped.output.find(line); at != std::string::npos;
       at = skipped.output.find(line, at + 1))
    ++said;
  EXPECT_EQ(said, 1u) << skipped.output;
}

TEST_F(ImagesE2E, DamagedPixelsFoundWhileTrainingAreNamedOrReplaced) {
  const std::string bad = dir_.file("train/class1/broken.png");
  write_png(bad, 8, 8, 1, make_pixels(99, 8, 8, 1));
  damage_png_pixels(bad);
  const Result r = train(2, 8, "late");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data.skip_bad"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("late.json")));

  const Result replaced = train(2, 8, "late-skip", "--set data.skip_bad=true");
  EXPECT_EQ(replaced.code, 0) << replaced.output;
  EXPECT_NE(replaced.output.find("krab: data.skip_bad: image '" + bad), std::string::npos)
      << replaced.output;
  EXPECT_NE(replaced.output.find("uses '"), std::string::npos) << replaced.output;
}

}  // namespace
}  // namespace krab::data
