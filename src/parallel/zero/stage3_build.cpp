#include "parallel/zero/stage3_build.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "models/describe.h"
#include "models/torchscript.h"

namespace krab::parallel::zero {

Stage3Builder::Stage3Builder(const engine::ShardLayout& layout, comm::Communicator& comm,
                             std::unique_ptr<DiskOffload> offload, int ward)
    : comm_(comm),
      storage_(std::make_unique<Stage3Storage>(layout, comm.rank(), std::move(offload), ward)) {
  for (int u = 1; u < layout.num_units(); ++u) unit_of_path_[layout.unit(u).name] = u;
}

void Stage3Builder::on_unit_built(const std::string& path, torch::nn::Module& module) {
  const engine::ShardLayout& layout = storage_->layout();
  if (!path.empty()) {
    const auto it = unit_of_path_.find(path);
    if (it == unit_of_path_.end()) return;  // not a unit: its parameters are the root's
    const int u = it->second;
    const auto named = module.named_parameters();
    std::vector<at::Tensor> params;
    for (const auto& span : layout.unit(u).params) {
      const auto* p = named.find(span.name.substr(path.size() + 1));
      KRAB_CHECK(p != nullptr, "sharded construction: unit '", path, "' has no parameter '",
                 span.name, "' (models::describe_parameters disagrees with the model)");
      params.push_back(*p);
    }
    storage_->adopt(u, params, comm_, /*keep_gathered=*/false);
    return;
  }
  // The whole model: the root, and the units no call announced (cnn and mlp announce after
  // building; a candidate that is not a unit never).
  const auto named = module.named_parameters();
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    if (storage_->adopted(u)) continue;
    std::vector<at::Tensor> params;
    for (const auto& span : layout.unit(u).params) {
      const auto* p = named.find(span.name);
      KRAB_CHECK(p != nullptr, "sharded construction: the model has no parameter '", span.name,
                 "' (models::describe_parameters disagrees with the model)");
      params.push_back(*p);
    }
    storage_->adopt(u, params, comm_, /*keep_gathered=*/u == 0);
  }
}

std::unique_ptr<Stage3Storage> Stage3Builder::take_storage() {
  KRAB_CHECK(storage_ && storage_->all_adopted(),
             "sharded construction: the model was not announced whole");
  return std::move(storage_);
}

namespace {

// Only its file knows a TorchScript model's parameters: it is loaded first without their
// values (models/torchscript.h, ParameterValues::kDeferred), which gives the layout, and then
// read unit by unit into the builder. Every rank reads the values it adopts (the page cache
// holds the file once per node); the broadcast of adopt() makes them rank 0's all the same.
std::unique_ptr<Stage3Engine> make_script_engine(const models::ModelSpec& spec,
                                                 std::unique_ptr<comm::Communicator> comm,
                                                 Stage3EngineOptions options,
                                                 const OptimizerFactory& make_optimizer) {
  auto model = std::make_shared<models::TorchScriptModel>(
      spec, models::TorchScriptModel::ParameterValues::kDeferred);
  std::vector<engine::ParamShape> params;
  for (const auto& item : model->named_parameters())
    if (item.value().requires_grad()) params.push_back({item.key(), item.value().sizes().vec()});
  const int ward = stage3_ward(options, *comm);
  Stage3Builder builder(plan_stage3_layout(params, model->unit_candidates(), options, comm->size()),
                        *comm, nullptr, ward);
  model->read_units(builder);
  return std::make_unique<Stage3Engine>(std::move(model), std::move(comm), std::move(options),
                                        make_optimizer, builder.take_storage());
}

}  // namespace

std::unique_ptr<Stage3Engine> make_stage3_engine(const models::ModelSpec& spec,
                                                 std::unique_ptr<comm::Communicator> comm,
                                                 Stage3EngineOptions options,
                                                 const OptimizerFactory& make_optimizer) {
  if (spec.name == "torchscript")
    return make_script_engine(spec, std::move(comm), options, make_optimizer);
  const models::ParameterTable table = models::describe_parameters(spec);
  std::vector<engine::ParamShape> params;
  for (const auto& p : table.params)
    if (p.trainable) params.push_back({p.name, p.shape});
  KRAB_CHECK_ARG(!params.empty(), "parallel.zero_stage: the model has no trainable parameters");
  const engine::ShardLayout layout =
      plan_stage3_layout(params, table.unit_candidates, options, comm->size());
  const int ward = stage3_ward(options, *comm);  // refuses offload with it, before the file
  // The file before the first unit: each master goes into it as its unit is built.
  Stage3Builder builder(
      layout, *comm, open_stage3_offload(layout, *comm, options.offload_dir, make_optimizer), ward);
  auto model = models::make_model(spec, &builder);
  return std::make_unique<Stage3Engine>(std::move(model), std::move(comm), std::move(options),
                                        make_optimizer, builder.take_storage());
}

}  // namespace krab::parallel::zero
