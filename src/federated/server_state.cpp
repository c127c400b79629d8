#include "federated/server_state.h"

#include <torch/serialize.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "core/seal.h"

namespace krab::federated {
namespace {

constexpr char kMagic[8] = {'K', 'R', 'A', 'B', 'F', 'L', 'S', '1'};
constexpr size_t kHeader = 8 + 8 + 4;

uint32_t crc_of(const std::string& s) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (size_t off = 0; off < s.size(); off += 1u << 30) {
    const size_t n = std::min<size_t>(1u << 30, s.size() - off);
    c = crc32(c, reinterpret_cast<const Bytef*>(s.data() + off), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(c);
}

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
                       const std::string& seal_key) {
  torch::serialize::OutputArchive archive;
  archive.write("global_model", runner.global());
  archive.write("rounds_done", torch::tensor(runner.rounds_done(), torch::kLong));
  nlohmann::json history = nlohmann::json::array();
  for (const auto& r : runner.history()) history.push_back(r.to_json());
  // Client names come from the tokens file and may not be UTF-8: replace such bytes rather
  // than throw (nlohmann's type_error.316) after a round that succeeded.
  archive.write("history", c10::IValue(history.dump(-1, ' ', false,
                                                    nlohmann::json::error_handler_t::replace)));
  archive.write("signature", c10::IValue(signature));
  std::vector<std::string> keys;
  for (const auto& [k, v] : runner.strategy().state()) {
    archive.write("strategy_" + k, v);
    keys.push_back(k);
  }
  archive.write("strategy_keys", c10::IValue(nlohmann::json(keys).dump()));
  std::ostringstream os;
  archive.save_to(os);
  const std::string payload = os.str();
  std::string out(kHeader, '\0');
  std::memcpy(out.data(), kMagic, 8);
  const uint64_t len = payload.size();
  const uint32_t crc = crc_of(payload);
  std::memcpy(out.data() + 8, &len, 8);
  std::memcpy(out.data() + 16, &crc, 4);
  core::write_file_atomic(path, core::seal(out + payload, seal_key));
}

bool load_server_state(const std::string& path, RoundRunner& runner, const std::string& signature,
                       const std::string& seal_key) {
  if (!core::path_exists(path)) return false;
  const std::string bytes = core::unseal(core::read_file(path), seal_key, path);
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw CorruptData(str_cat(path, ": not a krab federated server state (bad magic)"));
  uint64_t len = 0;
  uint32_t crc = 0;
  std::memcpy(&len, bytes.data() + 8, 8);
  std::memcpy(&crc, bytes.data() + 16, 4);
  if (len != bytes.size() - kHeader)
    throw CorruptData(str_cat(path, ": truncated or padded (header says ", len,
                              " payload bytes, file has ", bytes.size() - kHeader, ")"));
  const std::string payload = bytes.substr(kHeader);
  if (crc_of(payload) != crc) throw CorruptData(str_cat(path, ": checksum mismatch"));

  // The payload passed its CRC, so some writer wrote it, but not necessarily this krab: every
  // read below can meet a missing entry, the wrong type, an unknown pickled class or malformed
  // JSON, which LibTorch and nlohmann report with their own exceptions. Those are a corrupt
  // file; say so, naming it.
  torch::serialize::InputArchive archive;
  at::Tensor global;
  int64_t rounds_done = 0;
  std::map<std::string, at::Tensor> state;
  std::vector<RoundRecord> history;
  try {
    archive.load_from(payload.data(), payload.size());
    c10::IValue sig, hist, keys;
    archive.read("signature", sig);
    KRAB_CHECK_ARG(sig.toStringRef() == signature, path,
                   ": the checkpoint belongs to another model (signature differs)");
    at::Tensor rounds;
    archive.read("global_model", global);
    archive.read("rounds_done", rounds);
    archive.read("history", hist);
    archive.read("strategy_keys", keys);
    // The runner's own checks (restore()) come after the strategy has taken its state; check
    // here what would make them throw, so a bad file leaves the runner as it was.
    if (!global.defined() || global.dim() != 1 || global.scalar_type() != at::kFloat ||
        global.numel() != runner.global().numel())
      throw CorruptData(
          str_cat(path, ": the global model is not ", runner.global().numel(), " float32 values"));
    if (!rounds.defined() || rounds.numel() != 1 || rounds.scalar_type() != at::kLong ||
        (rounds_done = rounds.item<int64_t>()) < 0)
      throw CorruptData(str_cat(path, ": rounds_done is not a round count"));
    for (const auto& k :
         nlohmann::json::parse(keys.toStringRef()).get<std::vector<std::string>>()) {
      at::Tensor t;
      archive.read("strategy_" + k, t);
      state[k] = t;
    }
    for (const auto& j : nlohmann::json::parse(hist.toStringRef()))
      history.push_back(record_from_json(j));
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw CorruptData(str_cat(path, ": not a valid federated server state: ",
                              core::printable(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    // nlohmann::json's errors, and TorchScript's (an unknown type name in the pickle).
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
      seal_key_(core::read_seal_key(config.get_string("checkpoint.hmac_key_file"), run_dir)) {}

void ServerCheckpoint::resume(RoundRunner& runner) const {
  if (resume_ && load_server_state(path_, runner, signature_, seal_key_))
    std::fprintf(stderr, "krab: resumed %s after round %lld\n", path_.c_str(),
                 static_cast<long long>(runner.rounds_done()));
}

void ServerCheckpoint::save(RoundRunner& runner) const {
  save_server_state(path_, runner, signature_, seal_key_);
}

}  // namespace krab::federated
