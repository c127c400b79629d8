// StateReader: a checkpoint of either format as per-parameter values and optimizer fields
// (docs/design/zero-sharding.md §4.3), so that any writer's world size, ZeRO stage and wrap
// restores into any reader's:
//   - state.krab (format v2, train/checkpoint.h): one record with param.NAME and
//     optimizer.state.K.<field> (K = NAME's index in the model signature);
//   - a sharded checkpoint (train/manifest.h): the manifest's layout says which shard holds
//     which elements of a parameter (ShardLayout::locate, then shard = flat offset / S_u).
// Everything goes through parameter names, never through the writer's layout: the restore
// side plans its own ranges (ShardLayout::pieces of its shards, or whole parameters for a full
// replica) and asks for them.
//
// Restoring a TrainState (the loop's side of the protocol; the collective agreement between
// steps 1 and 2 is train/sharded_checkpoint.h's restore_checkpoint):
//   1. verify_restore(): the checkpoint is for this job (check_resumable), of this optimizer
//      type, and every file this rank's ranges touch is present and intact (size, SHA-256,
//      seal, CRC, checkpoint id, rank, world, step, entry shapes). Changes nothing.
//   2. (all ranks agree that step 1 passed everywhere)
//   3. install_restore(): reads the ranges straight into the state's tensors (the sharded
//      engine's values[u], the model's parameters and buffers), the optimizer state, the
//      generator. Cannot fail on file contents once step 1 passed.
//   4. the loop calls engine->after_restore().
//
// Errors: CorruptData naming the file (missing, truncated, changed, foreign: another checkpoint
// id, another run's seal); InvalidArgument for a checkpoint of another job or optimizer.
// A reader is used by one thread. It never holds a file whole: each file it opens is checked in
// one streaming pass (shard_file.h, open_checkpoint_file) and kept open with an index of its
// entries; read() takes a range with pread straight into dst. Memory: the entry headers and the
// scalar entries of the files this rank's ranges touch, plus replicated() once asked for.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/record.h"
#include "engine/engine.h"
#include "engine/shard_layout.h"
#include "train/checkpoint.h"

namespace krab::train {

class StateReader {
 public:
  virtual ~StateReader() = default;

  // The checkpoint in `step_dir` (manifest.krab if there is one, else state.krab), its
  // small file read, checked and unsealed with `seal_key` for `seal_job` (checkpoint_job()).
  // Shards are read later, by verify(). CorruptData / InvalidArgument naming the file.
  static std::unique_ptr<StateReader> open(const std::string& step_dir, const std::string& seal_key,
                                           const std::string& seal_job);

  const CheckpointMeta& meta() const { return meta_; }
  // The file that stands for the checkpoint in messages (state.krab or manifest.krab).
  const std::string& source() const { return source_; }
  bool sharded() const { return sharded_; }
  const std::string& optimizer_type() const { return optimizer_type_; }
  const std::map<std::string, double>& optimizer_options() const { return options_; }
  // Every parameter of the model that wrote it, in signature order.
  const std::vector<engine::ParamShape>& params() const { return params_; }

  // Loads and checks every file that reading elements [a, a + n) of `param` (any field) needs;
  // n < 0: the whole parameter. CorruptData naming the file; InvalidArgument for a name the
  // checkpoint does not have.
  virtual void verify(const std::string& param, int64_t a = 0, int64_t n = -1) = 0;
  // Elements [a, a + n) (row-major) of `param`'s values (field "value") or of its optimizer
  // state field (optimizer_state.h's state_fields() names) into dst, as fp32. verify() the
  // range first. has_field() says whether the field exists (momentum before the first step
  // does not); step_count() is Adam's count, nullopt where the parameter has no state. Both
  // look where element `at` of the parameter lives (a sharded checkpoint keeps them per
  // shard), so that a rank asks only the shards it verified.
  virtual void read(const std::string& param, const std::string& field, int64_t a, int64_t n,
                    float* dst) = 0;
  virtual bool has_field(const std::string& param, const std::string& field, int64_t at = 0) = 0;
  virtual std::optional<int64_t> step_count(const std::string& param, int64_t at = 0) = 0;
  // The record with what every rank holds whole: buffer.NAME and rng (state.krab itself, or
  // shard 0, loaded and checked on first use).
  virtual const core::Record& replicated() = 0;

 protected:
  CheckpointMeta meta_;
  std::string source_, optimizer_type_;
  bool sharded_ = false;
  std::map<std::string, double> options_;
  std::vector<engine::ParamShape> params_;
};

// Step 1 of the protocol above for `state` (a full replica: `state.optimizer`; or a sharded
// one: `state.sharded`, this rank = state.shard). `expect`: the job's meta (step unused).
void verify_restore(StateReader& reader, const CheckpointMeta& expect,
                    const engine::TrainState& state);
// Step 3: installs what verify_restore checked. Returns the checkpoint's meta.
CheckpointMeta install_restore(StateReader& reader, const engine::TrainState& state);

}  // namespace krab::train
