// train::plan_memory: the prediction's inputs from a job alone. A GPT's units are its blocks
// with the closed-form size 12w² + 13w each and the embeddings, final norm and head in the root;
// a TorchScript model's parameter count comes from its archive's tensor records without loading
// it (parameters plus buffers, all in the root unit); the optimizer and options follow the keys.
#include "train/memory_plan.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/script_modules.h"
#include "train/job.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
namespace zero = parallel::zero;

class MemoryPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("krab_memory_plan_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MemoryPlanTest, GptUnitsAreItsBlocksInClosedForm) {
  std::ofstream(dir_ / "corpus.txt") << std::string(4000, 'a') + "bcdefgh";
  const core::Config c = core::Config::parse(
      "model: {name: gpt, layers: 3, width: 16, heads: 2, context: 8}\n"
      "data: {name: text, path: '" +
          (dir_ / "corpus.txt").string() +
          "', batch_size: 2}\n"
          "train: {optimizer: {name: adamw}}\n",
      "gpt.yaml");
  const MemoryPlan plan = plan_memory(c, 4);
  const int64_t w = 16, block = 12 * w * w + 13 * w;
  ASSERT_EQ(plan.inputs.unit_numel.size(), 4u);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(plan.inputs.unit_numel[i], block) << "block " << i;
  const int64_t vocab = model_spec(c, load_data(c)).num_classes;
  EXPECT_EQ(plan.inputs.unit_numel[0], 2 * vocab * w + 8 * w + 2 * w);  // tok_emb, head, pos, ln_f
  EXPECT_EQ(plan.inputs.world_size, 4);
  EXPECT_EQ(plan.inputs.stage, 0);
  EXPECT_EQ(plan.inputs.optimizer, zero::OptimizerKind::kAdamW);
  EXPECT_TRUE(plan.activations_predicted);
  EXPECT_GT(plan.activations_plain, plan.activations_checkpointed);
  EXPECT_EQ(plan.inputs.activation_bytes, plan.activations_plain);
  EXPECT_NE(plan.model.find("a gpt of "), std::string::npos) << plan.model;
}

TEST_F(MemoryPlanTest, TorchScriptCountsItsArchiveTensorsWithoutLoadingIt) {
  test::ScriptBuilder b;
  torch::jit::Module net = b.net(32, 16, 4);  // 32·16+16 + 16+16 (bn) + 16·4+4 parameters
  const std::string path = (dir_ / "net.pt").string();
  net.save(path);
  const core::Config c = core::Config::parse("model: {name: torchscript, path: '" + path +
                                                 "'}\n"
                                                 "data: {name: synthetic, batch_size: 8}\n"
                                                 "train: {optimizer: {name: sgd, momentum: 0}}\n",
                                             "ts.yaml");
  const MemoryPlan plan = plan_memory(c, 2);
  const int64_t params = 32 * 16 + 16 + 16 + 16 + 16 * 4 + 4;
  // + running_mean and running_var (16 floats each) and num_batches_tracked (8 bytes).
  ASSERT_EQ(plan.inputs.unit_numel.size(), 1u);
  EXPECT_EQ(plan.inputs.unit_numel[0], params + 2 * 16 + 2);
  EXPECT_FALSE(plan.activations_predicted);
  EXPECT_EQ(plan.inputs.activation_bytes, 0);
  EXPECT_EQ(plan.inputs.optimizer, zero::OptimizerKind::kSgd);
}

}  // namespace
}  // namespace krab::train
