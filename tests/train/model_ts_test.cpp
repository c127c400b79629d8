// model.ts at the end of a run (train/checkpoint.h save_model_pt, models/script_file.h): the
// user's file loaded again with the trained weights copied in by name; a file changed during
// the run gets no model.ts (model.pt still written), rather than weights in other code.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "core/errors.h"
#include "models/torchscript.h"
#include "support/script_modules.h"
#include "train/checkpoint.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / ("krab-model-ts-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::shared_ptr<models::TorchScriptModel> load(const fs::path& file) {
  models::ModelSpec spec;
  spec.name = "torchscript";
  spec.path = file.string();
  return std::make_shared<models::TorchScriptModel>(spec);
}

// The weights the model holds now (not the file's), every parameter and buffer, in eval mode;
// the file's SHA-256 is the one the model recorded when it loaded.
TEST(ModelTs, HoldsTheModelsWeightsInTheUsersFile) {
  TempDir dir;
  test::ScriptBuilder b;
  b.net(8, 6, 3).save((dir.path / "net.ts").string());
  auto model = load(dir.path / "net.ts");
  EXPECT_EQ(model->file().path, (dir.path / "net.ts").string());
  EXPECT_EQ(models::script_file_change(model->file()), "");
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p));
    for (auto& t : model->buffers())
      if (t.is_floating_point()) t.add_(1.0);
  }
  save_model_pt((dir.path / "model.pt").string(), *model);
  torch::jit::Module ts = torch::jit::load((dir.path / "model.ts").string());
  EXPECT_FALSE(ts.is_training());
  std::map<std::string, at::Tensor> mine;
  for (const auto& item : model->named_parameters()) mine[item.key()] = item.value();
  for (const auto& item : model->named_buffers()) mine[item.key()] = item.value();
  size_t n = 0;
  for (const auto& p : ts.named_parameters()) {
    ++n;
    EXPECT_TRUE(torch::equal(p.value, mine.at(p.name))) << p.name;
  }
  for (const auto& p : ts.named_buffers()) {
    ++n;
    EXPECT_TRUE(torch::equal(p.value, mine.at(p.name))) << p.name;
  }
  EXPECT_EQ(n, mine.size());
}

TEST(ModelTs, AFileChangedDuringTheRunGetsNoModelTs) {
  TempDir dir;
  test::ScriptBuilder b;
  b.net(8, 6, 3).save((dir.path / "net.ts").string());
  auto model = load(dir.path / "net.ts");
  b.net(8, 6, 3).save((dir.path / "net.ts").string());  // same shapes, other weights
  const std::string change = models::script_file_change(model->file());
  EXPECT_NE(change.find("changed since the run loaded it"), std::string::npos) << change;
  save_model_pt((dir.path / "model.pt").string(), *model);
  EXPECT_TRUE(fs::exists(dir.path / "model.pt"));
  EXPECT_FALSE(fs::exists(dir.path / "model.ts"));
  try {
    model->save((dir.path / "other.ts").string());
    ADD_FAILURE() << "a changed file was saved with the model's weights";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find((dir.path / "net.ts").string()), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path / "other.ts"));
}

}  // namespace
}  // namespace krab::train
