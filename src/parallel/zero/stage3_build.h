// Sharded construction for ZeRO stage 3: a model larger than one worker never exists whole in
// one process (docs/design/zero-sharding.md §3.4).
//
// The units are planned before the model exists, from models::describe_parameters (the
// built-in models' parameter table, no tensor allocated) and parallel.wrap. Stage3Builder is
// the models::BuildObserver make_model tells of each unit as soon as it is constructed and
// initialised: it adopts the unit into Stage3Storage at once (its values moved into the unit's
// flat, the flat broadcast from rank 0, this rank's master shard kept, the flat freed), so the
// unit's parameters hold 0 bytes before the next unit is built. When make_model announces the
// whole model (path ""), the root unit and any unit not announced are adopted (the root stays
// gathered). gpt builds block by block, so a rank's peak is one block plus the embeddings and
// the master shards; cnn and mlp are built whole first (small). A TorchScript module is
// loaded without its trainable parameters' values (models/script_deferred.h), its units planned
// from what it loaded, and its parameters read unit by unit into the builder
// (TorchScriptModel::read_units): a rank's peak is one unit (read, and its flat) plus the root
// and the master shards, not the whole file.
//
// The result is exactly what building the model whole and then constructing Stage3Engine on
// it gives: the same values (the build draws the same random numbers in the same order; the
// observer draws none), the same layout (checked against the built model).
//
// Thread safety: the thread that calls make_model; adopting is collective, so every rank of
// the group builds the same model at the same time.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "comm/communicator.h"
#include "engine/shard_layout.h"
#include "models/model.h"
#include "parallel/zero/stage3_engine.h"
#include "parallel/zero/stage3_storage.h"

namespace krab::parallel::zero {

class Stage3Builder : public models::BuildObserver {
 public:
  // Adopts into a new Stage3Storage over `layout` (this rank: comm.rank()); with `offload`
  // (parallel.offload: disk) each unit's master goes into that file as the unit is adopted;
  // with `ward` >= 0 the storage keeps ward masters (Stage3Storage's constructor).
  Stage3Builder(const engine::ShardLayout& layout, comm::Communicator& comm,
                std::unique_ptr<DiskOffload> offload = nullptr, int ward = -1);

  void on_unit_built(const std::string& path, torch::nn::Module& module) override;

  // The storage, once make_model has returned (every unit adopted; Error otherwise).
  std::unique_ptr<Stage3Storage> take_storage();
  // The most bytes of unit flats alive at once so far.
  int64_t peak_bytes() const { return storage_->peak_bytes(); }

 private:
  comm::Communicator& comm_;
  std::unique_ptr<Stage3Storage> storage_;
  std::unordered_map<std::string, int> unit_of_path_;
};

// A Stage3Engine over `spec`'s model, built sharded (above): a built-in model through
// make_model's observer, a TorchScript model read unit by unit. `comm` is connected; torch's
// generator seeded. With options.replicate_shards the storage keeps the ward masters. The
// refusals of make_model, plan_units and Stage3Engine.
std::unique_ptr<Stage3Engine> make_stage3_engine(const models::ModelSpec& spec,
                                                 std::unique_ptr<comm::Communicator> comm,
                                                 Stage3EngineOptions options,
                                                 const OptimizerFactory& make_optimizer);

}  // namespace krab::parallel::zero
