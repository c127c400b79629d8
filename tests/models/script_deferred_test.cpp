// Loading a TorchScript model without its trainable parameters' bytes and reading them unit by
// unit (models/script_deferred.h, TorchScriptModel::ParameterValues::kDeferred): what ZeRO
// stage 3 builds a scripted model from. Checked against the plain load of the same file.
#include "models/script_deferred.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/errors.h"
#include "models/script_inspection.h"
#include "models/torchscript.h"
#include "support/sanitizer.h"
#include "support/script_modules.h"

namespace krab::models {
namespace {

namespace fs = std::filesystem;

int64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// `units` Linear(n, n) children l0, l1, ... called in a chain, a buffer `scale` and a tensor
// attribute `offset` (neither a parameter nor a buffer) on the root.
torch::jit::Module chain(test::ScriptBuilder& b, int units, int64_t n) {
  torch::jit::Module root = b.module("Chain");
  std::string body;
  for (int i = 0; i < units; ++i) {
    root.register_module("l" + std::to_string(i), b.linear(n, n));
    body += "    x = self.l" + std::to_string(i) + ".forward(x)\n";
  }
  root.register_buffer("scale", torch::full({n}, 0.5));
  root.register_attribute("offset", c10::TensorType::get(), torch::arange(n).to(torch::kFloat));
  root.define("def forward(self, x):\n    x = x.flatten(1)\n" + body +
              "    return x * self.scale + self.offset\n");
  return root;
}

class DeferredScript : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // a parameterised test's "Name/0"
    dir_ = fs::temp_directory_path() / ("krab-deferred-" + std::to_string(::getpid()) + "-" + name);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ModelSpec spec_of(const torch::jit::Module& m) {
    const std::string path = (dir_ / "net.ts").string();
    m.save(path);
    ModelSpec s;
    s.name = "torchscript";
    s.path = path;
    return s;
  }

  fs::path dir_;
  test::ScriptBuilder b_;
};

// Records, at each announcement, the announced module's parameters as they are then.
class Recorder : public BuildObserver {
 public:
  void on_unit_built(const std::string& path, torch::nn::Module& module) override {
    paths.push_back(path);
    for (const auto& item : module.named_parameters())
      values[path.empty() ? item.key() : path + "." + item.key()] = item.value().clone();
  }
  std::vector<std::string> paths;
  std::map<std::string, at::Tensor> values;
};

// Nothing of the parameters is read at load; each unit's values are in when it is announced,
// in forward order, then the root; the other tensors (a buffer, a tensor attribute) are read at
// once; the result is the plain load's, bit for bit, and runs as it does. Inspected or, with
// model.trust_code, not.
class DeferredScriptTrust : public DeferredScript, public ::testing::WithParamInterface<bool> {};

TEST_P(DeferredScriptTrust, ReadsEachUnitWhenItIsAnnouncedAndEqualsThePlainLoad) {
  ModelSpec spec = spec_of(chain(b_, 3, 24));
  spec.trust_code = GetParam();
  TorchScriptModel plain(spec);
  TorchScriptModel lazy(spec, TorchScriptModel::ParameterValues::kDeferred);
  int64_t trainable = 0;
  for (const auto& p : plain.parameters()) trainable += static_cast<int64_t>(p.nbytes());
  EXPECT_EQ(lazy.deferred_bytes(), trainable);
  EXPECT_TRUE(torch::equal(lazy.named_buffers()["scale"], plain.named_buffers()["scale"]));
  const at::Tensor x = torch::randn({5, 24});
  EXPECT_THROW(lazy.forward(x), Error);  // its parameters are not in yet

  Recorder seen;
  lazy.read_units(seen);
  EXPECT_EQ(seen.paths, (std::vector<std::string>{"l0", "l1", "l2", ""}));
  EXPECT_EQ(lazy.deferred_bytes(), 0);
  const auto want = plain.named_parameters();
  for (const auto& item : want) {
    ASSERT_TRUE(seen.values.count(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(seen.values.at(item.key()), item.value())) << item.key();
  }
  // `offset` is reached only through the scripted code: the outputs say it was read.
  EXPECT_TRUE(torch::equal(lazy.forward(x), plain.forward(x)));
}

INSTANTIATE_TEST_SUITE_P(InspectedOrTrusted, DeferredScriptTrust, ::testing::Bool());

// The reader keeps a skipped read only while the loaded module holds its storage: when one is
// let go (here: a buffer replaced after the load, as a load that copied a tensor would), it
// keeps nothing and says so, and the caller loads the file whole (torchscript.cpp).
TEST_F(DeferredScript, KeepsNothingWhenTheModuleDroppedASkippedStorage) {
  const ModelSpec spec = spec_of(chain(b_, 2, 8));
  const int64_t tensors = 2 * (8 * 8 + 8) * 4 + 8 * 4 + 8 * 4;  // l0, l1, scale, offset
  {
    auto reads = std::make_shared<DeferredTensorReads>(spec.path, "net.ts");
    torch::jit::Module m = load_torchscript_unchecked(reads, "net.ts");
    EXPECT_TRUE(reads->keep_reachable(m));
    EXPECT_EQ(reads->deferred_bytes(), tensors);
    reads->fill_all();
    EXPECT_TRUE(torch::equal(m.attr("scale").toTensor(), torch::full({8}, 0.5)));
  }
  auto reads = std::make_shared<DeferredTensorReads>(spec.path, "net.ts");
  torch::jit::Module m = load_torchscript_unchecked(reads, "net.ts");
  m.register_buffer("scale", torch::ones({8}));
  EXPECT_FALSE(reads->keep_reachable(m));
  EXPECT_EQ(reads->deferred_bytes(), 0);
}

// The load itself reserves the parameters' memory without writing it: a 64 MiB module grows
// the process by far less than its size until its units are read, and reading them one by one,
// each released before the next as a sharding observer does, never holds it whole. (Not under
// a sanitizer: its allocator ignores mallopt and keeps freed blocks in quarantine.)
TEST_F(DeferredScript, LoadingDoesNotHoldTheParameters) {
  if (KRAB_UNDER_SANITIZER) GTEST_SKIP() << "resident memory is the sanitizer allocator's";
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);  // as the stage-3 workers (train/engines.cpp)
  const int units = 16;
  const int64_t n = 1024, unit_bytes = n * (n + 1) * 4, model_bytes = units * unit_bytes;
  const ModelSpec spec = spec_of(chain(b_, units, n));
  const int64_t before = rss_bytes();
  TorchScriptModel lazy(spec, TorchScriptModel::ParameterValues::kDeferred);
  const int64_t loaded = rss_bytes();
  EXPECT_LT(loaded - before, model_bytes / 8) << "before " << before << " loaded " << loaded;

  // Frees each unit's parameters once read (set_data to an empty tensor), like adoption.
  struct Releaser : BuildObserver {
    int64_t largest_growth = 0, base = 0;
    void on_unit_built(const std::string& path, torch::nn::Module& module) override {
      largest_growth = std::max(largest_growth, rss_bytes() - base);
      if (path.empty()) return;
      torch::NoGradGuard no_grad;
      for (auto& p : module.parameters()) p.set_data(torch::empty({0}));
    }
  } release;
  release.base = rss_bytes();
  lazy.read_units(release);
  EXPECT_LT(release.largest_growth, 3 * unit_bytes) << "model " << model_bytes;
}

}  // namespace
}  // namespace krab::models
