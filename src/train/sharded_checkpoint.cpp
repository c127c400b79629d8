#include "train/sharded_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/random.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "comm/communicator.h"
#include "core/errors.h"
#include "core/fs.h"
#include "core/record.h"
#include "core/seal.h"
#include "engine/sharded_state.h"
#include "models/model.h"
#include "train/checkpoint_reader.h"
#include "train/manifest.h"
#include "train/optimizer_state.h"
#include "train/shard_file.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

// One rank's outcome as the allgather carries it: fixed size, so that one collective suffices.
//   [0] kind (0 ok, else Kind) | [1, 9) u64 shard bytes | [9, 73) SHA-256 hex | error text
enum Kind : uint8_t { kOk = 0, kCorrupt = 1, kInvalid = 2, kNotSupported = 3, kOther = 4 };
constexpr int64_t kStatusBytes = 1024;

struct Status {
  Kind kind = kOk;
  ShardDigest digest;
  std::string error;
};

std::vector<Status> gather_status(comm::Communicator& comm, const Status& mine) {
  at::Tensor out = at::zeros({kStatusBytes}, at::kByte);
  auto* p = static_cast<char*>(out.data_ptr());
  p[0] = static_cast<char>(mine.kind);
  std::memcpy(p + 1, &mine.digest.bytes, 8);
  std::memcpy(p + 9, mine.digest.sha256.data(), std::min<size_t>(64, mine.digest.sha256.size()));
  std::memcpy(p + 73, mine.error.data(),
              std::min<size_t>(kStatusBytes - 74, mine.error.size()));  // keeps a final NUL
  at::Tensor all = at::zeros({kStatusBytes * comm.size()}, at::kByte);
  comm.allgather(out, all)->wait();
  std::vector<Status> result(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    const char* q = static_cast<const char*>(all.data_ptr()) + r * kStatusBytes;
    result[r].kind = static_cast<Kind>(q[0]);
    std::memcpy(&result[r].digest.bytes, q + 1, 8);
    result[r].digest.sha256 = std::string(q + 9, strnlen(q + 9, 64));
    result[r].error = std::string(q + 73);
  }
  return result;
}

Status status_of(const std::exception& e) {
  Status s;
  s.error = e.what();
  s.kind = dynamic_cast<const CorruptData*>(&e)       ? kCorrupt
           : dynamic_cast<const InvalidArgument*>(&e) ? kInvalid
           : dynamic_cast<const NotSupported*>(&e)    ? kNotSupported
                                                      : kOther;
  return s;
}

[[noreturn]] void rethrow(const Status& s, const std::string& text) {
  switch (s.kind) {
    case kCorrupt:
      throw CorruptData(text);
    case kInvalid:
      throw InvalidArgument(text);
    case kNotSupported:
      throw NotSupported(text);
    default:
      throw Error(text);
  }
}

// The first failing rank's error on every rank (text prefixed with the rank when it is
// another's), or nothing when every rank succeeded.
void agree(const std::vector<Status>& all, int me, const char* what) {
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].kind != kOk)
      rethrow(all[r], static_cast<int>(r) == me
                          ? all[r].error
                          : str_cat(what, " failed on rank ", r, ": ", all[r].error));
}

std::string draw_checkpoint_id(comm::Communicator& comm) {
  at::Tensor bits = at::zeros({16}, at::kByte);
  if (comm.rank() == 0 && ::getrandom(bits.data_ptr(), 16, 0) != 16)
    throw Error(str_cat("cannot draw a checkpoint id: getrandom: ", std::strerror(errno)));
  comm.broadcast(bits, 0)->wait();
  static const char* digits = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 16; ++i) {
    const auto b = bits.data_ptr<uint8_t>()[i];
    id += digits[b >> 4];
    id += digits[b & 15];
  }
  return id;
}

ShardDigest write_own_shard(const std::string& step_dir, const CheckpointMeta& meta,
                            const std::string& id, const engine::TrainState& state, int rank,
                            int world, const CheckpointSeal& seal) {
  const engine::ShardedState& s = *state.sharded;
  core::RecordStreamWriter rec;
  rec.add_string("meta.checkpoint_id", id);
  rec.add_int("meta.rank", rank);
  rec.add_int("meta.world", world);
  rec.add_int("meta.step", meta.step);
  for (size_t u = 0; u < s.values.size(); ++u) {
    rec.add_tensor(str_cat("unit.", u, ".values"), s.values[u]);
    write_optimizer_state(*s.optimizers[u], rec, str_cat("unit.", u, ".optimizer"));
  }
  if (rank == 0) {
    for (const auto& item : state.model->named_parameters())
      if (!s.layout->locate(item.key())) rec.add_tensor("param." + item.key(), item.value());
    for (const auto& item : state.model->named_buffers())
      rec.add_tensor("buffer." + item.key(), item.value());
    rec.add_tensor("rng", at::detail::getDefaultCPUGenerator().get_state());
  }
  return write_shard_file(shard_path(step_dir, rank, world), rec, seal.key, seal.job);
}

std::string write_manifest_file(const std::string& step_dir, const CheckpointMeta& meta,
                                const std::string& id, const engine::TrainState& state,
                                const std::vector<Status>& all, const CheckpointSeal& seal) {
  const engine::ShardedState& s = *state.sharded;
  Manifest m;
  m.meta = meta;
  m.checkpoint_id = id;
  m.stage = s.stage;
  m.layout = *s.layout;
  m.optimizer_type = optimizer_type(*s.optimizers.at(0));
  m.optimizer_options = group_options(*s.optimizers.at(0));
  for (const Status& st : all) m.shards.push_back(st.digest);
  core::RecordWriter rec;
  write_manifest(m, rec);
  const std::string path = manifest_path(step_dir);
  core::write_file_atomic(path, core::seal(frame_checkpoint(rec.bytes()), seal.key, seal.job));
  return path;
}

}  // namespace

std::string save_sharded_checkpoint(comm::Communicator& comm, const std::string& run_dir,
                                    const CheckpointMeta& meta, const engine::TrainState& state,
                                    const CheckpointSeal& seal, int keep) {
  KRAB_CHECK(state.sharded != nullptr && state.sharded->layout != nullptr,
             "save_sharded_checkpoint needs a sharded TrainState");
  const int rank = comm.rank(), world = comm.size();
  const std::string id = draw_checkpoint_id(comm);
  const std::string step_dir = (fs::path(run_dir) / step_dir_name(meta.step)).string();
  Status mine;
  try {
    mine.digest = write_own_shard(step_dir, meta, id, state, rank, world, seal);
  } catch (const std::exception& e) {
    mine = status_of(e);
  }
  const std::vector<Status> all = gather_status(comm, mine);
  agree(all, rank, "writing checkpoint shards");
  // Every shard is on disk: rank 0 makes the checkpoint real, then tells the others.
  Status done;
  std::string path;
  if (rank == 0) try {
      path = write_manifest_file(step_dir, meta, id, state, all, seal);
      publish_step(run_dir, meta.step, keep);
    } catch (const std::exception& e) {
      done = status_of(e);
    }
  agree(gather_status(comm, done), rank, "writing the checkpoint manifest");
  return path;
}

CheckpointMeta restore_checkpoint(comm::Communicator* comm, const std::string& step_dir,
                                  const CheckpointSeal& seal, const CheckpointMeta& expect,
                                  const engine::TrainState& state) {
  std::unique_ptr<StateReader> reader;
  Status mine;
  try {
    reader = StateReader::open(step_dir, seal.key, seal.job);
    verify_restore(*reader, expect, state);
  } catch (const std::exception& e) {
    mine = status_of(e);
  }
  if (comm != nullptr)
    agree(gather_status(*comm, mine), comm->rank(), "restoring the checkpoint");
  else if (mine.kind != kOk)
    rethrow(mine, mine.error);
  return install_restore(*reader, state);
}

}  // namespace krab::train
