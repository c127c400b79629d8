// The federated server's checkpoint: what it needs to resume after a crash.
//
// One file, `<checkpoint.dir>/fl-state.krab`, rewritten atomically after every round
// (core::write_file_atomic: a crash leaves the previous round's file, never a torn one):
//
//   "KRABFLS1" | u64 payload length | u32 CRC-32 of the payload | payload
//
// where the payload is a LibTorch archive with the global parameters, the strategy's state
// (FedAdam/FedYogi moments), the number of rounds done, the model signature and the round
// history as JSON text. Loading checks magic, length, CRC and signature before touching the
// runner: a truncated, corrupt or foreign file is refused (CorruptData / InvalidArgument naming
// the file), and the runner is left as it was.
#pragma once

#include <optional>
#include <string>

#include "core/config.h"
#include "federated/rounds.h"

namespace krab::federated {

std::string state_path(const std::string& run_dir);

// Writes the runner's state; `signature` is train::model_signature() of the job's model.
// `seal_key` (core/seal.h; "" = none): the file is sealed with HMAC-SHA256 under it, and load
// requires a valid seal (a sealed file without the key is refused too).
void save_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key = "");

// Loads `path` into `runner`. Returns false (runner untouched) when the file does not exist.
bool load_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key = "");

// The checkpoint as a run's round loop uses it (fl-sim, fl-server): the file in the run
// directory, sealed with checkpoint.hmac_key_file's key, for the job's model.
class ServerCheckpoint {
 public:
  // Reads the seal key (core::read_seal_key: InvalidArgument for a bad key file).
  ServerCheckpoint(const core::Config& config, const std::string& run_dir, std::string signature);

  // With checkpoint.resume, loads the file into `runner` if it exists, and says so on stderr.
  void resume(RoundRunner& runner) const;
  // After every round, before the round is reported.
  void save(RoundRunner& runner) const;

 private:
  bool resume_;
  std::string path_, signature_, seal_key_;
};

// RoundRecord from its to_json() form.
RoundRecord record_from_json(const nlohmann::json& j);

}  // namespace krab::federated
