// The federated server's checkpoint: what it needs to resume after a crash.
//
// One file, `<checkpoint.dir>/fl-state.krab`, rewritten atomically after every round
// (core::write_file_atomic: a crash leaves the previous round's file, never a torn one):
//
//   "KRABFLS2" | u64 payload length | u32 CRC-32 of the payload | payload [| seal]
//
// where the payload is a record (core/record.h: data only, checked entry by entry, nothing
// handed to a LibTorch parser) with
//   signature (string), global_model (float32 tensor), rounds_done (int),
//   history (JSON text), strategy.KEY (tensors: the strategy's state, FedAdam/FedYogi moments).
// Loading checks magic, length, CRC, every entry and the signature before touching the runner:
// a truncated, corrupt or foreign file is refused (CorruptData / InvalidArgument naming the
// file), and the runner is left as it was. A "KRABFLS1" file (a LibTorch archive, which ran the
// code a forged file carried when it was loaded) is refused with a message saying so.
//
// With a seal key, the seal is bound to the job (core::job_identity: run directory + model),
// and ServerCheckpoint keeps a core::ReleaseCounter beside the key: a state file older than the
// rounds already released (put back from a copy), or a missing one when rounds were released, is
// refused, so the privacy budget a resumed run reports counts every released round.
#pragma once

#include <optional>
#include <string>

#include "core/config.h"
#include "core/release_counter.h"
#include "federated/rounds.h"

namespace krab::federated {

std::string state_path(const std::string& run_dir);

// Writes the runner's state; `signature` is train::model_signature() of the job's model.
// `seal_key` (core/seal.h; "" = none): the file is sealed with HMAC-SHA256 under it, and load
// requires a valid seal (a sealed file without the key is refused too).
// `job` (core::job_identity) binds the seal to the job; it matters only with a key.
void save_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key = "", const std::string& job = "");

// Loads `path` into `runner`. Returns false (runner untouched) when the file does not exist.
// `released`: rounds known to have been released (ReleaseCounter); a file saying fewer is
// refused as replayed (CorruptData), the runner untouched.
bool load_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key = "", const std::string& job = "",
                       int64_t released = 0);

// The checkpoint as a run's round loop uses it (fl-sim, fl-server): the file in the run
// directory, sealed with checkpoint.hmac_key_file's key, for the job's model, and with a key
// the count of released rounds beside it (core/release_counter.h).
class ServerCheckpoint {
 public:
  // Reads the seal key (core::read_seal_key: InvalidArgument for a bad key file, or for a key
  // whose directory cannot take the counter file).
  ServerCheckpoint(const core::Config& config, const std::string& run_dir, std::string signature);

  // With checkpoint.resume, loads the file into `runner` if it exists, and says so on stderr.
  // With a key, refuses (exit 2) a file saying fewer rounds than were released (CorruptData
  // "replayed"), and refuses to start from round 0 (InvalidArgument) when rounds of this run
  // were released, whether checkpoint.resume is false or the file is missing.
  void resume(RoundRunner& runner) const;
  // After every round, before the round is reported: raises the counter, then writes the file.
  void save(RoundRunner& runner) const;

 private:
  bool resume_;
  std::string path_, signature_, seal_key_, job_;
  core::ReleaseCounter counter_;
};

// RoundRecord from its to_json() form.
RoundRecord record_from_json(const nlohmann::json& j);

}  // namespace krab::federated
