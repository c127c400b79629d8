#include "federated/simulation.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "core/errors.h"
#include "core/fs.h"
#include "core/progress.h"
#include "data/partition.h"
#include "data/rng.h"
#include "data/sampler.h"
#include "federated/local_training.h"
#include "federated/privacy.h"
#include "federated/rounds.h"
#include "federated/secure_client.h"
#include "federated/server_state.h"
#include "train/checkpoint.h"
#include "train/dry_run.h"
#include "train/job.h"

namespace krab::federated {
namespace {

// A client living in this process. Everything it does is what `krab fl-client` does, except
// that the data arrives as a shard of the simulation's split and faults can be injected.
class SimClient : public Participant {
 public:
  SimClient(std::string id, int64_t index, data::TensorDataset data, LocalTrainer* trainer,
            uint64_t seed, double dropout, double attack_scale)
      : id_(std::move(id)),
        index_(index),
        data_(std::move(data)),
        trainer_(trainer),
        seed_(seed),
        dropout_(dropout),
        attack_scale_(attack_scale) {}

  const std::string& id() const override { return id_; }

  FitReply fit(const FitInstruction& ins) override {
    round_ = ins.round;
    drop_stage_ = drop_stage(ins.round, ins.secure);
    if (drop_stage_ == 0) throw PeerLost(str_cat(id_, ": simulated dropout before training"));
    RoundOptions ro;
    ro.proximal_mu = ins.proximal_mu;
    ro.clip_norm = ins.clip_norm;
    ro.local_noise_std = ins.local_noise_std;
    ro.seed = data::derive_seed(seed_, static_cast<uint64_t>(ins.round) * 1000003u + index_);
    LocalResult r = trainer_->train(ins.global, data_, ro);
    if (attack_scale_ != 0) r.update = r.update * (-attack_scale_);
    FitReply reply;
    reply.num_examples = r.num_examples;
    reply.mean_loss = r.mean_loss;
    if (!ins.secure) {
      reply.update = std::move(r.update);
      return reply;
    }
    secure_ = std::make_unique<SecureClient>(ins, std::move(r.update));
    reply.secagg = secure_->advertise();
    return reply;
  }

  std::vector<uint8_t> secagg(const SecAggRequest& request) override {
    KRAB_CHECK(secure_ != nullptr, "secagg request before a secure fit");
    if (drop_stage_ == static_cast<int>(request.stage))
      throw PeerLost(str_cat(id_, ": simulated dropout in secure aggregation stage ",
                             static_cast<int>(request.stage)));
    return secure_->handle(request);
  }

 private:
  // Where this client drops out in this round: 0 before training, 1-3 in that secure
  // aggregation stage (after it advertised its keys), -1 never.
  int drop_stage(int64_t round, bool secure) const {
    if (dropout_ <= 0) return -1;
    std::mt19937_64 rng(data::derive_seed(seed_ ^ 0x64726f70ULL, round * 1000003u + index_));
    if (data::uniform01(rng) >= dropout_) return -1;
    // Secure rounds: uniformly before training or in stage 1, 2 or 3.
    return secure ? static_cast<int>(data::uniform_below(rng, 4)) : 0;
  }

  std::string id_;
  int64_t index_;
  data::TensorDataset data_;
  LocalTrainer* trainer_;
  uint64_t seed_;
  double dropout_, attack_scale_;
  int64_t round_ = 0;
  int drop_stage_ = -1;
  std::unique_ptr<SecureClient> secure_;
};

// federated.partition and its knobs, for `clients` clients.
data::PartitionSpec partition_spec(const core::Config& config, int64_t clients, uint64_t seed) {
  data::PartitionSpec ps;
  ps.kind = config.get_string("federated.partition");
  ps.clients = clients;
  ps.alpha = config.get_float("federated.alpha");
  ps.classes_per_client = config.get_int("federated.classes_per_client");
  ps.seed = seed;
  return ps;
}

// Byzantine clients: the first round(fraction * n) of a seeded permutation.
std::vector<bool> pick_byzantine(const core::Config& config, int64_t num_clients, uint64_t seed) {
  std::mt19937_64 rng(data::derive_seed(seed, 0x62797a));
  const std::vector<int64_t> order = data::random_permutation(num_clients, rng);
  const auto attackers = static_cast<int64_t>(
      std::llround(config.get_float("federated.sim_byzantine_fraction") * num_clients));
  std::vector<bool> byzantine(num_clients, false);
  for (int64_t i = 0; i < attackers; ++i) byzantine[order[i]] = true;
  return byzantine;
}

// The simulated clients, each on its shard, sharing one trainer (they train one at a time).
struct Federation {
  std::vector<std::unique_ptr<SimClient>> clients;
  std::vector<Participant*> available;
  nlohmann::json client_examples = nlohmann::json::array();
  nlohmann::json byzantine_clients = nlohmann::json::array();
};

Federation make_federation(const core::Config& config, const data::DataSplits& d,
                           const std::vector<std::vector<int64_t>>& shards, LocalTrainer& trainer,
                           uint64_t seed) {
  const auto num_clients = static_cast<int64_t>(shards.size());
  const std::vector<bool> byzantine = pick_byzantine(config, num_clients, seed);
  Federation f;
  char name[32];
  for (int64_t i = 0; i < num_clients; ++i) {
    std::snprintf(name, sizeof name, "client-%04lld", static_cast<long long>(i));
    auto [x, y] = data::gather(d.train, shards[i]);
    f.clients.push_back(std::make_unique<SimClient>(
        name, i, data::TensorDataset{x, y}, &trainer, seed,
        config.get_float("federated.sim_dropout"),
        byzantine[i] ? config.get_float("federated.sim_attack_scale") : 0.0));
    f.available.push_back(f.clients.back().get());
    f.client_examples.push_back(shards[i].size());
  }
  for (int64_t i = 0; i < num_clients; ++i)
    if (byzantine[i]) f.byzantine_clients.push_back(f.clients[i]->id());
  return f;
}

}  // namespace

std::vector<std::vector<int64_t>> client_shards(const data::DataSplits& d,
                                                const data::PartitionSpec& ps) {
  KRAB_CHECK_ARG(!d.language_model || ps.kind == "iid", "federated.partition '", ps.kind,
                 "' splits by label; text data needs iid");
  const bool classes =
      !d.language_model && d.train.targets.dim() == 1 && !d.train.targets.is_floating_point();
  KRAB_CHECK_ARG(classes || d.language_model || ps.kind == "iid", "federated.partition '", ps.kind,
                 "' splits by label; labels that are not class indices need iid");
  return data::partition(classes ? d.train.targets : torch::zeros({d.train.size()}, torch::kLong),
                         classes ? d.num_classes : 1, ps);
}

nlohmann::json run_simulation(const core::Config& config, const SimulationOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  FederatedOptions fo = FederatedOptions::from_config(config);
  fo.seeded_cohorts = true;  // reproducible runs; see FederatedOptions
  torch::set_num_threads(static_cast<int>(config.get_int("train.threads_per_worker")));
  const data::DataSplits d = train::load_data(config);
  const models::ModelSpec spec = train::model_spec(config, d);
  const uint64_t seed = static_cast<uint64_t>(config.get_int("train.seed"));
  const int64_t num_clients = config.get_int("federated.clients");
  KRAB_CHECK_ARG(fo.min_clients <= num_clients, "federated.min_clients (", fo.min_clients,
                 ") is more than federated.clients (", num_clients, ")");
  const data::PartitionSpec ps = partition_spec(config, num_clients, seed);
  const auto shards = client_shards(d, ps);

  torch::manual_seed(seed);
  LocalTrainer trainer(config, spec);
  auto eval_model = models::make_model(spec);
  train::print_model_warnings(*eval_model);
  const std::string signature = train::model_signature(trainer.model());
  const Federation federation = make_federation(config, d, shards, trainer, seed);

  const train::Metric metric = train::resolve_metric(config, *eval_model, d);
  train::dry_run(*eval_model, d, config);  // before any round; changes no state (train/dry_run.h)
  RoundRunner runner(
      fo, flatten_parameters(trainer.model()), /*parallel_calls=*/false,
      held_out_evaluator(*eval_model, d, metric, config.get_int("train.eval_examples")));
  const std::string run_dir = train::run_directory(config);
  const ServerCheckpoint checkpoint(config, run_dir, signature);
  checkpoint.resume(runner);

  std::fprintf(stderr,
               "krab: fl-sim — %lld clients (%s), %lld rounds of %s/%s, model %s (%lld "
               "parameters)%s%s\n",
               static_cast<long long>(num_clients), ps.kind.c_str(),
               static_cast<long long>(fo.rounds), fo.strategy.c_str(), fo.aggregator.c_str(),
               spec.name.c_str(), static_cast<long long>(trainer.num_parameters()),
               fo.secure ? ", secure aggregation" : "",
               fo.dp != DpMode::kNone ? str_cat(", dp ", dp_mode_name(fo.dp)).c_str() : "");
  RoundLog progress("fl-sim", fo.rounds, options.show_progress, /*log_dropped=*/false);
  while (runner.rounds_done() < fo.rounds) {
    const RoundRecord rec = runner.run_round(federation.available);
    checkpoint.save(runner);  // durable before it is reported
    progress.record(rec);
  }
  progress.finish();

  load_flat_parameters(trainer.model(), runner.global());
  train::save_model_pt(run_dir + "/model.pt", trainer.model());

  nlohmann::json report;
  report["mode"] = "fl-sim";
  report["clients"] = num_clients;
  report["partition"] = ps.kind;
  report["client_examples"] = federation.client_examples;
  report["byzantine_clients"] = federation.byzantine_clients;
  report["strategy"] = fo.strategy;
  report["aggregator"] = fo.aggregator;
  report["secure_aggregation"] = fo.secure;
  report["dp"] = dp_mode_name(fo.dp);
  report["model"] = spec.name;
  report["parameters"] = trainer.num_parameters();
  add_history(report, runner);
  if (config.get_int("train.eval_examples") > 0 && d.test)
    report["eval_examples"] =
        train::evaluation_size(d.test->size(), config.get_int("train.eval_examples"));
  report["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!options.report_path.empty())
    core::write_file_atomic(options.report_path, core::dump_json(report),
                            core::FileAccess::kShared);
  require_a_successful_round(runner);
  return report;
}

}  // namespace krab::federated
