// Small files that state large sizes (issue 24, item 3): each reader refuses them by name before
// it allocates what they state. Every file here is a few kilobytes and states far more than it
// holds, but no more than a few megabytes, so that the reader of the commit before the checks,
// which believed them, copied them out harmlessly and these tests failed on it without taking
// the machine's memory (the end-to-end run of the real bombs, with a memory cap and a peak-RSS
// bound, is bombs_e2e_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/tensor_file.h"
#include "test_util.h"

namespace krab::data {
namespace {

using testing::expect_throw_containing;
using testing::TempDir;

// Views whose sizes state more elements than their storage holds, as torch.save writes them (it
// saves a view as its storage plus offset, sizes and strides), and labels far beyond the rest.
const char* kWriteFiles = R"PY(
import os, sys, torch
d = sys.argv[1]
def save(name, obj):
    torch.save(obj, os.path.join(d, name))
n = 1000
save("expanded_x.pt", {"x": torch.zeros(1, 3).expand(n, 3), "y": torch.zeros(n, dtype=torch.long)})
save("expanded_y.pt", {"x": torch.zeros(n, 3), "y": torch.zeros(1, dtype=torch.int8).expand(n)})
save("overlapping.pt", {"x": torch.arange(10.).as_strided((8, 3), (1, 1)),
                        "y": torch.zeros(8, dtype=torch.long)})
t = torch.arange(20.).view(4, 5)
save("columns.pt", {"y": t[:, 4].long(), "x": t[:, :4]})
save("big_label.pt", {"x": torch.zeros(3, 2), "y": torch.tensor([0, 20000000, 1])})
save("top_label.pt", {"x": torch.zeros(3, 2), "y": torch.tensor([0, 65535, 1])})
)PY";

class Bombs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string script = dir_->file("write.py");
    std::ofstream(script) << kWriteFiles;
    const std::string cmd = std::string(KRAB_PYTHON) + " " + script + " " + dir_->path().string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string file(const std::string& name) { return dir_->file(name); }
  static TempDir* dir_;
};

TempDir* Bombs::dir_ = nullptr;

// A 4 KB file with x.expand(10^6, 1, 28, 28) was copied out to 1.1 GB. Every way in refuses
// such a view now: the whole file, its header, and a data set of it.
TEST_F(Bombs, ViewsStatingMoreElementsThanTheirStorageAreRefused) {
  struct Case {
    const char* name;
    std::initializer_list<std::string> parts;
  };
  for (const Case& c : {
           Case{"expanded_x.pt", {"'x' of shape [1000, 3]", "3000 elements", "holds 3"}},
           Case{"expanded_y.pt", {"'y' of shape [1000]", "1000 elements", "holds 1"}},
           Case{"overlapping.pt", {"'x' of shape [8, 3]", "24 elements", "holds 10"}},
       }) {
    SCOPED_TRACE(c.name);
    const std::string path = file(c.name);
    std::vector<std::string> parts(c.parts);
    parts.push_back(path);
    parts.push_back("x.contiguous()");
    auto expect = [&](const std::function<void()>& fn) {
      try {
        fn();
        ADD_FAILURE() << "accepted " << c.name;
      } catch (const CorruptData& e) {
        for (const std::string& part : parts)
          EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    };
    expect([&] { read_tensor_file(path); });
    expect([&] { inspect_tensor_file(path, /*with_labels=*/false); });
    expect([&] { load_tensors(path, {}); });
  }
  // Views that state no more than their storage are still read (and copied out compact).
  const TensorDataset d = read_tensor_file(file("columns.pt"));
  EXPECT_TRUE(d.inputs.equal(torch::arange(20, torch::kFloat32).view({4, 5}).narrow(1, 0, 4)));
  EXPECT_TRUE(d.targets.equal(torch::tensor({4, 9, 14, 19}, torch::kInt64)));
}

// One label of 2*10^7 made a model with 2*10^7 outputs (6.6 GB, killed at 120 s).
TEST_F(Bombs, InferredClassesAreBoundedAndStatedOnesBelieved) {
  const std::string path = file("big_label.pt");
  expect_throw_containing<InvalidArgument>(
      [&] { load_tensors(path, {}); },
      {path, "label 20000000", "20000001 classes", "65536", "data.num_classes"});
  EXPECT_EQ(load_tensors(file("top_label.pt"), {}).num_classes, kMaxInferredClasses);
  TensorsOptions o;
  o.num_classes = 10;  // stated: a label at or above it is refused by file
  expect_throw_containing<InvalidArgument>([&] { load_tensors(path, o); },
                                           {path, "label 20000000", "data.num_classes"});
  o.num_classes = 20000001;  // the job says so: believed
  EXPECT_EQ(load_tensors(path, o).num_classes, 20000001);
}

std::string write_csv(const TempDir& dir, const std::string& text) {
  const std::string path = dir.file("table.csv");
  std::ofstream(path) << text;
  return path;
}

TEST(CsvClasses, StatedClassesBoundTheLabelsAndLiftTheInferredLimit) {
  TempDir dir;
  const std::string many = write_csv(dir, "a,label\n1,0\n2,70000\n");
  expect_throw_containing<CorruptData>([&] { load_csv(many, "label", 0.0, false); },
                                       {"table.csv:3", "label '70000'", "data.num_classes"});
  EXPECT_EQ(load_csv(many, "label", 0.0, false, 70001).num_classes, 70001);
  const std::string few = write_csv(dir, "a,label\n1,0\n2,5\n");
  expect_throw_containing<CorruptData>([&] { load_csv(few, "label", 0.0, false, 5); },
                                       {"table.csv:3", "label '5'", "data.num_classes 5"});
  EXPECT_EQ(load_csv(few, "label", 0.0, false, 6).num_classes, 6);
}

// A gzip file whose IDX header states `n` images of 28 x 28 but whose stream holds `held`
// bytes of them.
void write_idx_gz(const std::string& path, uint32_t n, size_t held) {
  std::string bytes = {0, 0, 8, 3};
  for (const uint32_t v : {n, 28u, 28u})
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>(v >> s));
  bytes.append(held, '\0');
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Deflate turns 16 GiB of zeros into 16 MB: the header is checked against the file's size
// before any payload is read, not only against the 16 GiB ceiling.
TEST(IdxBombs, AGzipHeaderStatingFarMoreThanTheFileCanHoldIsRefusedBeforeReading) {
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  write_idx_gz(path, 100000, 1 << 20);  // 78 MB stated, 1 MiB of zeros (about 1 KB) held
  ASSERT_LT(std::filesystem::file_size(path), 8192u);
  expect_throw_containing<CorruptData>([&] { read_idx(path, kIdxImagesMagic); },
                                       {path, "78400000 bytes", "32 times"});
  // Within the allowance a small file still reads (and is then checked as before).
  write_idx_gz(path, 10, 10 * 28 * 28);
  EXPECT_EQ(read_idx(path, kIdxImagesMagic).sizes(), (std::vector<int64_t>{10, 28, 28}));
}

}  // namespace
}  // namespace krab::data
