#include "federated/server_job.h"

#include <sodium.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace krab::federated {
namespace {

// "train.optimizer.lr" -> "/train/optimizer/lr": where to_json() keeps a dotted key.
nlohmann::json::json_pointer pointer_of(const std::string& key) {
  std::string p = "/" + key;
  for (char& c : p)
    if (c == '.') c = '/';
  return nlohmann::json::json_pointer(p);
}

}  // namespace

// Derived from what a client reads between Hello and its last round (processes.cpp): the model
// it builds (train::model_spec), its data (train::load_data for the kinds fl-server supports:
// fashion-mnist, csv, synthetic), its local optimizer and steps (LocalTrainer), and, with
// --partition, the shard it cuts as fl-sim would. Everything else a client reads is its own
// (paths, threads, cache sizes) or comes with each task (privacy settings). A key belongs here
// only if the client cannot run the federation's model without the server's value for it.
const std::vector<std::string>& server_job_keys() {
  static const std::vector<std::string> keys = {
      // the model's architecture
      "model.name", "model.hidden", "model.layers", "model.width", "model.heads", "model.context",
      "model.freeze_batchnorm",
      // how the client's own data becomes examples of the model's shape
      "data.name", "data.normalize", "data.label_column", "data.test_fraction",
      "data.synthetic_samples", "data.synthetic_features", "data.synthetic_classes",
      // the training recipe of a round
      "data.batch_size", "train.seed", "train.loss", "train.optimizer.name", "train.optimizer.lr",
      "train.optimizer.momentum", "train.optimizer.weight_decay", "federated.local_epochs",
      "federated.local_steps",
      // --partition K/N (experiments): the shard is cut as fl-sim cuts it
      "federated.partition", "federated.alpha", "federated.classes_per_client"};
  return keys;
}

std::string job_for_clients(const core::Config& config) {
  const nlohmann::json all = config.to_json();
  nlohmann::json job = nlohmann::json::object();
  for (const std::string& key : server_job_keys()) job[pointer_of(key)] = all.at(pointer_of(key));
  return job.dump() + "\n";
}

core::Config client_job(const std::string& server_yaml, const std::string& server_model_sha256,
                        const LocalJob& local) {
  core::Config job = core::Config::parse(server_yaml, "the server's job");
  // Every key the server did not list still has its registry default, so `job` is the defaults
  // plus the server's listed keys once this passes.
  const auto& allowed = server_job_keys();
  std::string refused;
  for (const core::KeySpec& spec : core::registry())
    if (job.is_set(spec.key) &&
        std::find(allowed.begin(), allowed.end(), spec.key) == allowed.end())
      refused += (refused.empty() ? "" : ", ") + spec.key;
  KRAB_CHECK_ARG(refused.empty(), "the server's job sets ", refused,
                 ": a federated client takes from its server only the model's architecture and "
                 "the training recipe (docs/federated.md), never a path or a setting of this "
                 "machine");

  if (!local.data.empty()) job.set("data.path", local.data);
  const bool torchscript = job.get_string("model.name") == "torchscript";
  if (!torchscript) {
    KRAB_CHECK_ARG(local.model.empty(), "--model ", local.model,
                   ": the server's model is the built-in '", job.get_string("model.name"),
                   "', not a TorchScript module");
    return job;
  }
  KRAB_CHECK_ARG(!local.model.empty(),
                 "the server's model is a TorchScript module (a program, which would run in this "
                 "client): give this client its own copy with --model FILE");
  KRAB_CHECK_ARG(server_model_sha256.size() == 64,
                 "the server states no SHA-256 for its TorchScript module; --model ", local.model,
                 " cannot be compared with it");
  const std::string mine = file_sha256(local.model, "--model");
  KRAB_CHECK_ARG(mine == server_model_sha256, "--model ", local.model, ": SHA-256 ", mine,
                 " differs from the server's module (", server_model_sha256, ")");
  job.set("model.path", local.model);
  return job;
}

std::string file_sha256(const std::string& path, const std::string& what) {
  std::error_code ec;
  KRAB_CHECK_ARG(std::filesystem::is_regular_file(path, ec), what, " ", path,
                 ": not a readable regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InvalidArgument(
        str_cat(what, " ", path, ": cannot read it (", std::strerror(errno), ")"));
  KRAB_CHECK(sodium_init() >= 0, "libsodium failed to initialise");
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0)
    crypto_hash_sha256_update(&st, reinterpret_cast<const unsigned char*>(buf),
                              static_cast<unsigned long long>(in.gcount()));
  if (in.bad()) throw InvalidArgument(str_cat(what, " ", path, ": read error"));
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(&st, digest);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : digest) hex += {kHex[b >> 4], kHex[b & 15]};
  return hex;
}

}  // namespace krab::federated
