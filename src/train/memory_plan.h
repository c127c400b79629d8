// What one worker of a job will hold, from the job alone: the parameter table of its model
// (models::describe_parameters for the built-ins, the storage records of a TorchScript archive),
// its units, its optimizer and options as the inputs of parallel::zero::predict_memory
// (docs/design/zero-sharding.md §5). No model is built and no parameter allocated, so the
// launcher can size a 40-billion-parameter configuration in milliseconds and refuse it before
// any worker starts; the report prints the same prediction beside what was measured.
//
// Keys this reads that other pieces of issue 26 register (parallel.zero_stage, parallel.wrap,
// parallel.prefetch, parallel.offload, model.activation_checkpointing, train.precision) are read
// only when the registry has them, with the defaults of design §7 otherwise (stage 0, wrap auto,
// prefetch 1, no offload, no checkpointing, fp32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/dataset.h"
#include "engine/shard_layout.h"
#include "models/model.h"
#include "parallel/zero/memory_model.h"

namespace krab::train {

struct MemoryPlan {
  std::string model;  // for messages: "a gpt of 38.7 B parameters"
  // The prediction's inputs as the job is configured; activation_bytes is the estimate for
  // the configured checkpointing.
  parallel::zero::MemoryInputs inputs;
  int64_t activations_plain = 0;          // activation estimate without checkpointing
  int64_t activations_checkpointed = -1;  // with model.activation_checkpointing; -1: no estimate
  bool activations_predicted = true;      // false for torchscript (0 is not a prediction)
  int64_t data_bytes = 0;                 // training + test tensors one worker holds
};

// The plan of `config` for a data-parallel group of `world` ranks over the data `d` (as
// load_data gives it; only its shapes and resident bytes are read): the model's parameter table
// and units. Throws InvalidArgument naming the key, as preflight would, for a model the job
// cannot have.
MemoryPlan plan_memory(const core::Config& config, const data::DataSplits& d, int world);

// The same, loading the data itself (lazily, as preflight does).
MemoryPlan plan_memory(const core::Config& config, int world);

// The inputs for trainable parameters `params` (named_parameters order) with `candidates` as
// the model's unit candidates, for `world` ranks under `config`'s keys; activation_bytes is
// left 0. Shared by plan_memory and the report (which passes the built model's parameters).
parallel::zero::MemoryInputs memory_inputs(const core::Config& config, int world,
                                           const std::vector<engine::ParamShape>& params,
                                           const std::vector<std::string>& candidates);

// A TorchScript archive's stored values: the bytes of its "data/N" records (torch.jit.save
// stores every storage, parameters and buffers, once) over 4, an upper bound of its fp32
// parameter count read from the zip directory without loading the module. InvalidArgument
// naming model.path when the file cannot be read; CorruptData when it is no zip archive.
int64_t archive_values(const std::string& path);

// The activation bytes evaluation's forward pass peaks at on one rank of a `world`-rank group:
// no gradients, over the rank's share of the `test_size` examples it evaluates (the split, or
// train.eval_examples of it: evaluation_size, train/job.h), at most kEvaluationBatch at a time
// (models/describe.h); 0 without a test split. Pure.
int64_t evaluation_activation_bytes(const models::ModelSpec& spec, int64_t test_size, int world);

// The value of an int / bool / string key when the registry has it, else `fallback`.
int64_t int_key_or(const core::Config& c, const std::string& key, int64_t fallback);
bool bool_key_or(const core::Config& c, const std::string& key, bool fallback);
std::string string_key_or(const core::Config& c, const std::string& key,
                          const std::string& fallback);

}  // namespace krab::train
