#include "federated/server_state.h"

#include <torch/torch.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "core/record.h"
#include "core/release_counter.h"
#include "core/seal.h"

namespace krab::federated {
namespace {

uint32_t crc_of(const char* p, size_t size) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (size_t off = 0; off < size; off += 1u << 30) {
    const size_t n = std::min<size_t>(1u << 30, size - off);
    c = crc32(c, reinterpret_cast<const Bytef*>(p + off), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(c);
}

constexpr char kMagic[8] = {'K', 'R', 'A', 'B', 'F', 'L', 'S', '2'};
constexpr char kOldMagic[8] = {'K', 'R', 'A', 'B', 'F', 'L', 'S', '1'};
constexpr size_t kHeader = 8 + 8 + 4;
constexpr const char* kStrategyPrefix = "strategy.";

uint32_t crc_of(const std::string& s) { return crc_of(s.data(), s.size()); }

}  // namespace

std::string state_path(const std::string& run_dir) { return run_dir + "/fl-state.krab"; }

RoundRecord record_from_json(const nlohmann::json& j) {
  RoundRecord r;
  r.round = j.at("round").get<int64_t>();
  r.ok = j.at("ok").get<bool>();
  r.failure = j.value("failure", "");
  r.cohort = j.at("cohort").get<std::vector<std::string>>();
  r.counted = j.at("counted").get<std::vector<std::string>>();
  for (const auto& d : j.at("dropped")) r.dropped.push_back({d.at("client"), d.at("reason")});
  for (const auto& d : j.at("rejected")) r.rejected.push_back({d.at("client"), d.at("reason")});
  r.bytes_down = j.at("bytes_down").get<int64_t>();
  r.bytes_up = j.at("bytes_up").get<int64_t>();
  r.mean_loss = j.at("mean_loss").get<double>();
  r.seconds = j.at("seconds").get<double>();
  r.test_accuracy = j.value("test_accuracy", -1.0);
  if (j.contains("test_loss")) r.test_loss = j.at("test_loss").get<double>();
  r.epsilon = j.value("epsilon", -1.0);
  r.sampling_rate = j.value("sampling_rate", -1.0);
  r.available = j.value("available", int64_t{0});
  return r;
}

void save_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key, const std::string& job) {
  core::RecordWriter record;
  record.add_string("signature", signature);
  record.add_tensor("global_model", runner.global());
  record.add_int("rounds_done", runner.rounds_done());
  nlohmann::json history = nlohmann::json::array();
  for (const auto& r : runner.history()) history.push_back(r.to_json());
  // Client names come from the tokens file and may not be UTF-8: replace such bytes rather
  // than throw (nlohmann's type_error.316) after a round that succeeded.
  record.add_string("history",
                    history.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  for (const auto& [k, v] : runner.strategy().state()) record.add_tensor(kStrategyPrefix + k, v);
  const std::string payload = record.bytes();
  std::string out(kHeader, '\0');
  std::memcpy(out.data(), kMagic, 8);
  const uint64_t len = payload.size();
  const uint32_t crc = crc_of(payload);
  std::memcpy(out.data() + 8, &len, 8);
  std::memcpy(out.data() + 16, &crc, 4);
  core::write_file_atomic(path, core::seal(out + payload, seal_key, job));
}

bool load_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key, const std::string& job, int64_t released) {
  if (!core::path_exists(path)) return false;
  const std::string bytes = core::unseal(core::read_file(path), seal_key, path, job);
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kOldMagic, 8) == 0)
    throw CorruptData(str_cat(
        path,
        ": a federated server state of the first format (KRABFLS1), a LibTorch archive that "
        "could run code when loaded; this krab no longer reads it: start the run afresh "
        "(checkpoint.resume: false, or a new run directory), or finish it with the krab that "
        "wrote it"));
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw CorruptData(str_cat(path, ": not a krab federated server state (bad magic)"));
  uint64_t len = 0;
  uint32_t crc = 0;
  std::memcpy(&len, bytes.data() + 8, 8);
  std::memcpy(&crc, bytes.data() + 16, 4);
  if (len != bytes.size() - kHeader)
    throw CorruptData(str_cat(path, ": truncated or padded (header says ", len,
                              " payload bytes, file has ", bytes.size() - kHeader, ")"));
  if (crc_of(bytes.data() + kHeader, len) != crc)
    throw CorruptData(str_cat(path, ": checksum mismatch"));

  // The payload passed its CRC, so some writer wrote it, but not necessarily this krab: the
  // record reader checks every entry, its accessors refuse a missing or mistyped one, and the
  // history's JSON may still be malformed (nlohmann's exceptions: a corrupt file, named).
  const core::Record in = core::Record::parse(bytes.data() + kHeader, len, path);
  KRAB_CHECK_ARG(in.text("signature") == signature, path,
                 ": the checkpoint belongs to another model (signature differs)");
  const at::Tensor& global = in.tensor("global_model");
  const int64_t rounds_done = in.integer("rounds_done");
  // The runner's own checks (restore()) come after the strategy has taken its state; check
  // here what would make them throw, so a bad file leaves the runner as it was.
  if (global.dim() != 1 || global.scalar_type() != at::kFloat ||
      global.numel() != runner.global().numel())
    throw CorruptData(
        str_cat(path, ": the global model is not ", runner.global().numel(), " float32 values"));
  if (rounds_done < 0) throw CorruptData(str_cat(path, ": rounds_done is not a round count"));
  if (rounds_done < released)
    throw CorruptData(str_cat(path, ": replayed: ", released,
                              " rounds of this run were released, this file says ", rounds_done,
                              " (an older copy put back?); resuming from it would under-report "
                              "the privacy budget"));
  std::map<std::string, at::Tensor> state;
  for (const auto& name : in.names())
    if (name.rfind(kStrategyPrefix, 0) == 0)
      state[name.substr(std::strlen(kStrategyPrefix))] = in.tensor(name);
  std::vector<RoundRecord> history;
  try {
    for (const auto& j : nlohmann::json::parse(in.text("history")))
      history.push_back(record_from_json(j));
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(
        str_cat(path, ": not a valid federated server state: ", core::printable(e.what())));
  }
  // Everything parsed: only now change the runner.
  runner.strategy().load_state(state);
  runner.restore(global, rounds_done, std::move(history));
  return true;
}

ServerCheckpoint::ServerCheckpoint(const core::Config& config, const std::string& run_dir,
                                   std::string signature)
    : resume_(config.get_bool("checkpoint.resume")),
      path_(state_path(run_dir)),
      signature_(std::move(signature)),
      seal_key_(core::read_seal_key(config.get_string("checkpoint.hmac_key_file"), run_dir)),
      job_(seal_key_.empty() ? "" : core::job_identity("fl-server-state", run_dir, signature_)),
      counter_(config.get_string("checkpoint.hmac_key_file"), seal_key_, job_) {
  // The counter is written after every round: find out now, not after the first round, that
  // the key's directory does not take it.
  if (counter_.enabled()) {
    const std::filesystem::path dir = std::filesystem::path(counter_.path()).parent_path();
    core::check_writable_dir(dir.empty() ? "." : dir.string(),
                             "checkpoint.hmac_key_file (the count of released rounds is kept "
                             "beside the key)");
  }
}

void ServerCheckpoint::resume(RoundRunner& runner) const {
  // Rounds whose results left this process under this key, for this run: the privacy budget a
  // resumed run reports must count them all.
  const int64_t released = counter_.value();
  const auto refuse_fresh_start = [&](const std::string& why) {
    throw InvalidArgument(str_cat(
        why, ", but ", released, " rounds of this run were already released (", counter_.path(),
        "): starting again from round 0 would under-report the privacy budget. Resume it with "
        "its fl-state.krab, or start a new run deliberately under another name (name: or "
        "checkpoint.dir)"));
  };
  if (!resume_) {
    if (released > 0) refuse_fresh_start("checkpoint.resume is false");
    return;
  }
  if (!load_server_state(path_, runner, signature_, seal_key_, job_, released)) {
    if (released > 0)
      refuse_fresh_start(str_cat("checkpoint.resume is true and ", path_, " is missing"));
    return;
  }
  std::fprintf(stderr, "krab: resumed %s after round %lld\n", path_.c_str(),
               static_cast<long long>(runner.rounds_done()));
}

void ServerCheckpoint::save(RoundRunner& runner) const {
  // The counter first: once it moves, no file saying fewer rounds is resumed, whatever happens
  // to the state file written next (a crash in between refuses the resume, never undercounts).
  counter_.advance(runner.rounds_done());
  save_server_state(path_, runner, signature_, seal_key_, job_);
}

}  // namespace krab::federated
