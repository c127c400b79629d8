// The manifest of a sharded checkpoint (docs/design/zero-sharding.md §4.1): the one small file
// that says what the shards beside it are. Rank 0 writes it after every rank has written its
// shard; `latest` moves after it, so a step directory without a manifest is never resumed.
//
// manifest.krab = state.krab's version 2 frame (train/checkpoint.h: magic, length, CRC, seal)
// around a record:
//   meta.step meta.model_name meta.signature meta.global_batch meta.seed    (CheckpointMeta)
//   meta.model_file meta.model_sha256              (TorchScript runs, as state.krab: for export)
//   meta.checkpoint_id   string  32 hex digits, drawn per checkpoint; every shard repeats it
//   zero.stage           int     the writer's parallel.zero_stage
//   layout.world layout.alignment layout.units                  (engine/shard_layout.h)
//   layout.unit.U.name   string  the unit's module path ("" for the root)
//   layout.unit.U.params string  "name:[d0, d1];..." in flat order (model_signature's format)
//   layout.unit.U.padded int     the unit's padded length, checked against plan_layout's
//   optimizer.type, optimizer.groups, optimizer.group.0.*     (unit 0's; every unit shares them)
//   shard.R.bytes        int     shard R's file size
//   shard.R.sha256       string  its SHA-256
// Each shard file (train/shard_file.h) holds meta.checkpoint_id meta.rank meta.world
// meta.step, and per unit U: unit.U.values (fp32 [S_U], padding included) and its optimizer
// state under unit.U.optimizer.* (train/optimizer_state.h, one parameter: state.0.*); shard 0
// also buffer.NAME, param.NAME of every parameter in no unit (frozen ones) and rng.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/record.h"
#include "engine/shard_layout.h"
#include "train/checkpoint.h"
#include "train/shard_file.h"

namespace krab::train {

struct Manifest {
  CheckpointMeta meta;
  std::string checkpoint_id;
  int stage = 0;
  engine::ShardLayout layout;
  std::string optimizer_type;                       // "sgd" | "adam" | "adamw"
  std::map<std::string, double> optimizer_options;  // train/optimizer_state.h's names
  std::vector<ShardDigest> shards;                  // by rank; layout.world() of them
};

// "step-N/manifest.krab" and "step-N/shard-00003-of-00004.krab" inside `step_dir`.
std::string manifest_path(const std::string& step_dir);
std::string shard_path(const std::string& step_dir, int rank, int world);

// "name:[d0, d1];..." (model_signature's and layout.unit.U.params's format) as names and
// shapes; CorruptData naming `source` and `key` for anything else.
std::vector<engine::ParamShape> parse_param_list(const std::string& text, const std::string& source,
                                                 const std::string& key);

// The manifest's record entries (the caller frames and seals them).
void write_manifest(const Manifest& m, core::RecordEntries& out);
// Reads and checks a manifest record: every entry present and of its kind, the layout
// rebuilt with plan_layout() and equal to the recorded padding, one digest per rank, a
// 32-hex-digit id. CorruptData naming in.source().
Manifest read_manifest(const core::Record& in);

}  // namespace krab::train
