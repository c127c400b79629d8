// The report's `memory` field (docs/design/zero-sharding.md §5.3): per rank, what its engine
// holds by kind (Engine::memory()), its peak resident memory (VmHWM), and beside them what
// parallel::zero::predict_memory predicts for the job, so a reader sees the formula checked
// against the run.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/config.h"
#include "engine/engine.h"
#include "models/model.h"

namespace krab::train {

// Peak resident set size of this process in bytes (VmHWM in /proc/self/status), -1 when
// unreadable. Thread-ranks share one process, so they report the same value.
int64_t peak_rss_bytes();

// Collective (every rank of `group` calls it, in the same order as its other collectives):
// a [world, kMemoryColumns] float64 table whose row r holds rank r's engine.memory() and peak
// RSS. Exact for values below 2^53 bytes.
at::Tensor gather_rank_memory(const engine::Engine& engine, comm::Communicator& group);

// The `memory` field from gather_rank_memory's table: {stage, precision,
// activation_checkpointing, ranks: [{rank, peak_rss_bytes, params_bytes, grads_bytes,
// optimizer_bytes, working_set_peak_bytes, offloaded_bytes, predicted: {params, grads,
// optimizer, working_set, comm_buffers, low_precision, compression, activations, evaluation,
// heap, offloaded, total, process, data, peak}}]}. The measured *_bytes are null for an engine that
// does not measure (MemoryStats::known false); `predicted` comes from the trainable parameters and
// unit candidates of `model` and the job's keys (train/memory_plan.h), with `activation_bytes` (the
// caller's estimate, 0 when none) and `evaluation_bytes` (evaluation's, 0 when none); `total`
// is its resident() and `peak` adds the LibTorch
// process and kDataCopies of `data_bytes` (the data tensors a worker holds), which is what the
// launcher checks against the budget and what peak_rss_bytes is to stay under.
nlohmann::json memory_report(const core::Config& config, models::Model& model,
                             const at::Tensor& table, int64_t activation_bytes,
                             int64_t evaluation_bytes, int64_t data_bytes);

}  // namespace krab::train
