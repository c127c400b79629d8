// make_model's BuildObserver (models/units.h): every unit announced once, in forward order,
// then the root; a unit's parameters final when it is announced; gpt's weights drawn module by
// module.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "models/model.h"

namespace krab::models {
namespace {

// Records each announcement and a copy of the announced module's parameters at that moment.
class Recorder : public BuildObserver {
 public:
  void on_unit_built(const std::string& path, torch::nn::Module& module) override {
    paths.push_back(path);
    modules[path] = &module;
    for (const auto& item : module.named_parameters())
      values[path + "." + item.key()] = item.value().detach().clone();
  }
  std::vector<std::string> paths;
  std::map<std::string, torch::nn::Module*> modules;
  std::map<std::string, at::Tensor> values;
};

ModelSpec gpt_spec(int64_t layers) {
  ModelSpec s;
  s.name = "gpt";
  s.input_shape = {8};
  s.num_classes = 50;
  s.layers = layers;
  s.width = 16;
  s.heads = 2;
  s.context = 8;
  return s;
}

TEST(BuildObserver, AnnouncesEachUnitInOrderThenTheRoot) {
  ModelSpec cnn;
  cnn.name = "cnn";
  cnn.input_shape = {1, 8, 8};
  ModelSpec mlp;
  mlp.name = "mlp";
  mlp.input_shape = {6};
  for (const ModelSpec& spec : {gpt_spec(3), cnn, mlp}) {
    SCOPED_TRACE(spec.name);
    Recorder seen;
    auto model = make_model(spec, &seen);
    std::vector<std::string> want = model->unit_candidates();
    want.push_back("");
    EXPECT_EQ(seen.paths, want);
    const auto modules = model->named_modules();
    for (const std::string& path : model->unit_candidates())
      EXPECT_EQ(seen.modules[path], modules[path].get()) << path;
    EXPECT_EQ(seen.modules[""], model.get());
  }
}

// A sharded engine keeps its shard of a unit when the unit is announced: nothing may change
// a unit's parameters afterwards. The recorded values equal the finished model's, and the
// root's announcement sees every parameter final.
TEST(BuildObserver, AUnitIsFinalWhenAnnounced) {
  torch::manual_seed(1);
  Recorder seen;
  auto model = make_model(gpt_spec(3), &seen);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const std::string unit = name.rfind("blocks.", 0) == 0 ? name.substr(0, name.find('.', 7)) : "";
    const std::string key = unit.empty() ? "." + name : name;
    ASSERT_TRUE(seen.values.count(key)) << name;
    EXPECT_TRUE(torch::equal(seen.values[key], item.value())) << name;
  }
  // And the initialisation is GPT-2's, as before the per-unit order.
  auto p = model->named_parameters();
  EXPECT_EQ(p["blocks.1.attn.qkv.bias"].abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(p["blocks.2.ln1.weight"].equal(torch::ones({16})));
}

// Module by module: construct, then initialise. So the weights of the embeddings and of the
// first block do not depend on how many blocks follow (with construct-all-then-initialise,
// every later block's construction drew before the embeddings' initialisation).
TEST(BuildObserver, GptDrawsItsWeightsModuleByModule) {
  torch::manual_seed(2);
  auto one = make_model(gpt_spec(1))->named_parameters();
  torch::manual_seed(2);
  auto three = make_model(gpt_spec(3))->named_parameters();
  for (const char* name :
       {"tok_emb.weight", "pos_emb.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc.weight"})
    EXPECT_TRUE(torch::equal(one[name], three[name])) << name;
  // The residual projections are scaled by 1/sqrt(2 layers): the same draws, another scale.
  EXPECT_TRUE(torch::allclose(one["blocks.0.attn.proj.weight"] * std::sqrt(1.0 / 3.0),
                              three["blocks.0.attn.proj.weight"], 1e-5, 1e-7));
}

}  // namespace
}  // namespace krab::models
