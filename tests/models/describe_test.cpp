// models::describe_parameters against the models it describes: for every built-in model and
// several specs, the table equals named_parameters() of the model make_model builds (names,
// shapes, order), its unit candidates are modules of that model, and a spec make_model refuses
// is refused with the same message.
#include "models/describe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "core/errors.h"

namespace krab::models {
namespace {

ModelSpec spec_of(const std::string& name, std::vector<int64_t> input, int64_t classes) {
  ModelSpec s;
  s.name = name;
  s.input_shape = std::move(input);
  s.num_classes = classes;
  return s;
}

std::vector<ModelSpec> specs() {
  std::vector<ModelSpec> out;
  out.push_back(spec_of("mlp", {32}, 10));
  ModelSpec mlp = spec_of("mlp", {3, 5, 7}, 3);
  mlp.hidden = 17;
  out.push_back(mlp);
  out.push_back(spec_of("cnn", {1, 28, 28}, 10));
  out.push_back(spec_of("cnn", {3, 9, 13}, 7));  // H, W not multiples of 4: floored pools
  ModelSpec gpt = spec_of("gpt", {16}, 50);
  gpt.layers = 3;
  gpt.width = 24;
  gpt.heads = 3;
  gpt.context = 20;
  out.push_back(gpt);
  ModelSpec one = spec_of("gpt", {4}, 2);
  one.layers = 1;
  one.width = 8;
  one.heads = 1;
  one.context = 4;
  out.push_back(one);
  return out;
}

std::string spec_name(const ModelSpec& s) {
  return str_cat(s.name, " ", at::IntArrayRef(s.input_shape), " classes ", s.num_classes);
}

TEST(DescribeParameters, EqualsNamedParametersOfTheBuiltModel) {
  for (const ModelSpec& spec : specs()) {
    SCOPED_TRACE(spec_name(spec));
    const ParameterTable table = describe_parameters(spec);
    const auto model = make_model(spec);
    const auto named = model->named_parameters();
    ASSERT_EQ(table.params.size(), named.size());
    for (size_t i = 0; i < named.size(); ++i) {
      EXPECT_EQ(table.params[i].name, named[i].key()) << "parameter " << i;
      EXPECT_EQ(at::IntArrayRef(table.params[i].shape), named[i].value().sizes()) << named[i].key();
      EXPECT_EQ(table.params[i].trainable, named[i].value().requires_grad()) << named[i].key();
    }
    EXPECT_EQ(table.numel(), parameter_count(*model));
  }
}

TEST(DescribeParameters, UnitCandidatesAreModulesOfTheModelInForwardOrder) {
  for (const ModelSpec& spec : specs()) {
    SCOPED_TRACE(spec_name(spec));
    const ParameterTable table = describe_parameters(spec);
    const auto model = make_model(spec);
    std::set<std::string> modules;
    for (const auto& item : model->named_modules("", /*include_self=*/false))
      modules.insert(item.key());
    ASSERT_FALSE(table.unit_candidates.empty());
    for (const std::string& path : table.unit_candidates)
      EXPECT_TRUE(modules.count(path)) << path << " is not a module of the model";
    // Once the model lists its own candidates (Model::unit_candidates), they must agree.
    if (!model->unit_candidates().empty()) {
      EXPECT_EQ(table.unit_candidates, model->unit_candidates());
    }
  }
  ModelSpec gpt = specs()[4];
  EXPECT_EQ(describe_parameters(gpt).unit_candidates,
            (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  EXPECT_EQ(describe_parameters(specs()[2]).unit_candidates,
            (std::vector<std::string>{"conv1", "conv2", "fc1", "fc2"}));
  EXPECT_EQ(describe_parameters(specs()[0]).unit_candidates,
            (std::vector<std::string>{"fc1", "fc2", "fc3"}));
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(DescribeParameters, RefusesWhatMakeModelRefusesWithTheSameMessage) {
  std::vector<ModelSpec> bad;
  ModelSpec heads = specs()[4];
  heads.heads = 5;  // does not divide width 24
  bad.push_back(heads);
  ModelSpec longer = specs()[4];
  longer.input_shape = {21};  // more than context 20
  bad.push_back(longer);
  bad.push_back(spec_of("cnn", {1, 3, 28}, 10));
  ModelSpec hidden = specs()[0];
  hidden.hidden = 0;
  bad.push_back(hidden);
  bad.push_back(spec_of("mlp", {32}, 1));
  bad.push_back(spec_of("resnet", {32}, 10));
  for (const ModelSpec& spec : bad) {
    SCOPED_TRACE(spec_name(spec));
    const std::string want = message_of([&] { make_model(spec); });
    EXPECT_NE(want, "(nothing thrown)");
    EXPECT_EQ(message_of([&] { describe_parameters(spec); }), want);
  }
  ModelSpec script = spec_of("torchscript", {4}, 2);
  script.path = "net.pt";
  EXPECT_NE(message_of([&] { describe_parameters(script); }).find("net.pt"), std::string::npos);
}

// reduced_spec: the mlp and gpt it gives take the inputs of the full model and give outputs of
// its shape (the launcher's dry run relies on it), with far fewer parameters; cnn and
// torchscript have none.
TEST(ReducedSpec, TakesTheSameInputsAndGivesTheSameOutputs) {
  for (const ModelSpec& spec : specs()) {
    SCOPED_TRACE(spec_name(spec));
    const auto small = reduced_spec(spec);
    if (spec.name == "cnn") {
      EXPECT_FALSE(small.has_value());
      continue;
    }
    ASSERT_TRUE(small.has_value());
    EXPECT_LE(describe_parameters(*small).numel(), describe_parameters(spec).numel());
    torch::manual_seed(0);
    at::Tensor x = spec.name == "gpt"
                       ? torch::randint(0, spec.num_classes, {2, spec.input_shape[0]})
                       : torch::randn([&] {
                           std::vector<int64_t> s{2};
                           s.insert(s.end(), spec.input_shape.begin(), spec.input_shape.end());
                           return s;
                         }());
    EXPECT_EQ(make_model(*small)->forward(x).sizes(), make_model(spec)->forward(x).sizes());
  }
  ModelSpec big = specs()[4];
  big.width = 3 * 4096;
  big.layers = 48;
  const auto small = reduced_spec(big);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->layers, 1);
  EXPECT_EQ(small->width, 3);  // one value per head
  EXPECT_EQ(small->heads, 3);
  EXPECT_EQ(small->context, big.context);
  EXPECT_EQ(small->num_classes, big.num_classes);
  EXPECT_LT(describe_parameters(*small).numel(), 1000);
  ModelSpec script = spec_of("torchscript", {4}, 2);
  EXPECT_FALSE(reduced_spec(script).has_value());
}

TEST(ActivationBytes, GptClosedFormAndCheckpointing) {
  ModelSpec gpt = specs()[4];  // T 16, width 24, heads 3, vocab 50, 3 layers
  const int64_t batch = 2, tokens = batch * 16;
  const int64_t block = tokens * (16 * 24 + 2 * 3 * 16);
  const int64_t outside = tokens * (3 * 24 + 2 * 50);
  EXPECT_EQ(activation_bytes(gpt, batch, false), 4 * (3 * block + outside + block));
  EXPECT_EQ(activation_bytes(gpt, batch, true), 4 * (3 * tokens * 24 + block + outside + block));
  EXPECT_LT(activation_bytes(gpt, batch, true), activation_bytes(gpt, batch, false));
  EXPECT_EQ(activation_bytes(gpt, 2 * batch, false), 2 * activation_bytes(gpt, batch, false));
  ModelSpec script = spec_of("torchscript", {4}, 2);
  EXPECT_EQ(activation_bytes(script, batch, false), 0);
}

}  // namespace
}  // namespace krab::models
