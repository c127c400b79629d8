#include "federated/processes.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <utility>

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
#include "federated/server_job.h"
#include "federated/server_state.h"
#include "federated/simulation.h"
#include "federated/transport.h"
#include "train/checkpoint.h"
#include "train/dry_run.h"
#include "train/job.h"

namespace krab::federated {
namespace {

using std::chrono::milliseconds;

milliseconds seconds_key(const core::Config& c, const char* key) {
  return milliseconds(static_cast<int64_t>(c.get_float(key) * 1000));
}

// The server's own data: held-out examples only. It never reads a training split a client
// might hold; for fashion-mnist without eval data it knows the shape without opening anything.
data::DataSplits server_data(const core::Config& c) {
  const std::string& name = c.get_string("data.name");
  const std::string& eval = c.get_string("federated.eval_data");
  if (name == "fashion-mnist") {
    if (!eval.empty()) return data::load_fashion_mnist_test(eval, c.get_bool("data.normalize"));
    data::DataSplits d;
    d.input_shape = {1, 28, 28};
    d.num_classes = 10;
    return d;
  }
  if (name == "synthetic") {
    // Generated from train.seed: there are no client files to protect; keep the test split.
    data::DataSplits d = train::load_data(c);
    d.train = {};
    return d;
  }
  if (name == "csv") {
    // A table's shape (features, classes) is in its rows, and the server holds none of the
    // clients': it needs its own held-out file with the same columns. All of it is test data.
    KRAB_CHECK_ARG(!eval.empty(),
                   "federated.eval_data: fl-server with data.name csv needs a "
                   "held-out CSV file of its own, with the clients' columns and every class "
                   "(the model's shape is read from it)");
    data::DataSplits all =
        data::load_csv(eval, c.get_string("data.label_column"), 0.0, c.get_bool("data.normalize"),
                       c.get_int("data.num_classes"));
    data::DataSplits d;
    d.input_shape = all.input_shape;
    d.num_classes = all.num_classes;
    d.test = std::move(all.train);
    return d;
  }
  throw NotSupported(str_cat("fl-server: data.name '", name,
                             "' is not supported (fashion-mnist, csv, synthetic)"));
}

// How fl-server listens and what it tells clients, from the job's config; checks that the
// model fits in a message.
ServerTransportOptions server_transport(const core::Config& config, const std::string& signature,
                                        int64_t parameters) {
  ServerTransportOptions so;
  so.address = config.get_string("federated.address");
  so.cert_file = config.get_string("federated.tls_cert");
  so.key_file = config.get_string("federated.tls_key");
  so.client_ca_file = config.get_string("federated.tls_client_ca");
  so.tokens = read_tokens(config.get_string("federated.tokens"));
  so.max_message_bytes =
      static_cast<int64_t>(config.get_float("federated.max_message_mb") * (1 << 20));
  so.config_yaml = job_for_clients(config);
  so.model_signature = signature;
  // A TorchScript module is a program: clients run their own copy, checked against this digest.
  if (config.get_string("model.name") == "torchscript")
    so.model_sha256 = file_sha256(config.get_string("model.path"), "model.path");
  so.deadline = seconds_key(config, "federated.round_deadline_s");
  const int64_t model_bytes = parameters * 4;
  KRAB_CHECK_ARG(model_bytes + (64 << 10) <= so.max_message_bytes, "federated.max_message_mb (",
                 config.get_float("federated.max_message_mb"), ") is too small for the model (",
                 model_bytes / double(1 << 20), " MiB of parameters plus framing)");
  return so;
}

// Waits federated.wait_clients_s for federated.clients to join. Returns how many did; Timeout
// when that is fewer than federated.min_clients.
size_t wait_for_federation(FederationServer& server, const core::Config& config,
                           const FederatedOptions& fo) {
  const auto want = static_cast<size_t>(config.get_int("federated.clients"));
  const size_t joined =
      server.wait_for_clients(want, seconds_key(config, "federated.wait_clients_s"));
  if (static_cast<int64_t>(joined) < fo.min_clients)
    throw Timeout(str_cat("fl-server: only ", joined, " client(s) joined within ",
                          config.get_float("federated.wait_clients_s"),
                          " s; federated.min_clients is ", fo.min_clients));
  std::fprintf(stderr, "krab: %zu client(s) ready; %lld rounds of %s\n", joined,
               static_cast<long long>(fo.rounds), fo.strategy.c_str());
  return joined;
}

// The clients a round can sample from: waits (federated.wait_clients_s) while fewer than
// federated.min_clients are alive, then gives up with Timeout.
std::vector<Participant*> available_for_round(FederationServer& server, const core::Config& config,
                                              const RoundRunner& runner) {
  const int64_t min_clients = runner.options().min_clients;
  std::vector<Participant*> available = server.available();
  if (static_cast<int64_t>(available.size()) >= min_clients) return available;
  server.wait_for_clients(static_cast<size_t>(min_clients),
                          seconds_key(config, "federated.wait_clients_s"));
  available = server.available();
  if (static_cast<int64_t>(available.size()) < min_clients)
    throw Timeout(str_cat("fl-server: ", available.size(), " client(s) alive before round ",
                          runner.rounds_done() + 1, "; federated.min_clients is ", min_clients));
  return available;
}

}  // namespace

nlohmann::json run_fl_server(const core::Config& config, const ServerRunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  FederatedOptions fo = FederatedOptions::from_config(config);
  torch::set_num_threads(static_cast<int>(config.get_int("train.threads_per_worker")));
  const data::DataSplits d = server_data(config);
  const models::ModelSpec spec = train::model_spec(config, d);
  torch::manual_seed(static_cast<uint64_t>(config.get_int("train.seed")));
  auto model = models::make_model(spec);
  train::print_model_warnings(*model);
  const std::string signature = train::model_signature(*model);
  KRAB_CHECK_ARG(!config.get_string("federated.tokens").empty(),
                 "federated.tokens: fl-server needs a tokens file (NAME TOKEN [EXPIRES] lines)");

  const ServerTransportOptions so =
      server_transport(config, signature, models::parameter_count(*model));
  FederationServer server(so);
  std::fprintf(stderr, "krab: fl-server listening on %s (port %d, TLS%s), %zu client tokens\n",
               so.address.c_str(), server.port(),
               so.client_ca_file.empty() ? "" : ", client certificates required", so.tokens.size());
  if (!options.port_file.empty())
    core::write_file_atomic(options.port_file, std::to_string(server.port()) + "\n",
                            core::FileAccess::kShared);

  RoundRunner runner(fo, flatten_parameters(*model), /*parallel_calls=*/true,
                     held_out_evaluator(*model, d, train::resolve_metric(config, *model, d),
                                        config.get_int("train.eval_examples")));
  const std::string run_dir = train::run_directory(config);
  const ServerCheckpoint checkpoint(config, run_dir, signature);
  checkpoint.resume(runner);

  const size_t joined = wait_for_federation(server, config, fo);
  RoundLog progress("fl-server", fo.rounds, options.show_progress, /*log_dropped=*/true);
  while (runner.rounds_done() < fo.rounds) {
    const RoundRecord rec = runner.run_round(available_for_round(server, config, runner));
    checkpoint.save(runner);  // durable before it is reported
    progress.record(rec);
    if (options.on_round) options.on_round(rec);
  }
  progress.finish();
  server.finish(milliseconds(3000));

  load_flat_parameters(*model, runner.global());
  train::save_model_pt(run_dir + "/model.pt", *model);
  const TransportStats st = server.stats();
  nlohmann::json report;
  report["mode"] = "fl-server";
  report["model"] = spec.name;
  report["parameters"] = models::parameter_count(*model);
  report["strategy"] = fo.strategy;
  report["aggregator"] = fo.aggregator;
  report["secure_aggregation"] = fo.secure;
  report["dp"] = dp_mode_name(fo.dp);
  report["clients_joined"] = joined;
  add_history(report, runner);
  if (config.get_int("train.eval_examples") > 0 && d.test)
    report["eval_examples"] =
        train::evaluation_size(d.test->size(), config.get_int("train.eval_examples"));
  report["wire_bytes_in"] = st.bytes_in;
  report["wire_bytes_out"] = st.bytes_out;
  report["refused_calls"] = st.refused_calls;
  report["refusals"] = st.refusals;
  report["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!options.report_path.empty())
    core::write_file_atomic(options.report_path, core::dump_json(report),
                            core::FileAccess::kShared);
  std::fprintf(stderr, "krab: model %s/model.pt\n", run_dir.c_str());
  require_a_successful_round(runner);
  return report;
}

namespace {

// "K/N" -> {K, N} with 0 <= K < N.
std::pair<int64_t, int64_t> parse_partition(const std::string& s) {
  const size_t slash = s.find('/');
  try {
    KRAB_CHECK_ARG(slash != std::string::npos, "");
    size_t a = 0, b = 0;
    const int64_t k = std::stoll(s.substr(0, slash), &a);
    const int64_t n = std::stoll(s.substr(slash + 1), &b);
    KRAB_CHECK_ARG(a == slash && b == s.size() - slash - 1 && n >= 1 && k >= 0 && k < n, "");
    return {k, n};
  } catch (const std::exception&) {
    throw InvalidArgument(str_cat("--partition must be K/N with 0 <= K < N, got '", s, "'"));
  }
}

ClientTransportOptions client_transport(const ClientRunOptions& options) {
  ClientTransportOptions to;
  to.server = options.server;
  to.ca_file = options.ca_file;
  to.cert_file = options.cert_file;
  to.key_file = options.key_file;
  to.server_name = options.server_name;
  to.token = options.token;
  return to;
}

// How long the client keeps retrying a server it cannot reach or a token still in use.
milliseconds retry_period(const ClientRunOptions& options) {
  return milliseconds(static_cast<int64_t>(options.retry_s * 1000));
}

// The server may still be starting: retries an unreachable one for the retry period.
FederationClient::Hello say_hello(FederationClient& client, const ClientRunOptions& options) {
  const auto first = std::chrono::steady_clock::now();
  for (;;) {
    try {
      return client.hello();
    } catch (const PeerLost&) {
      if (std::chrono::steady_clock::now() - first > retry_period(options)) throw;
      std::this_thread::sleep_for(milliseconds(500));
    }
  }
}

// The examples this client trains on: its whole training split, or with --partition K/N the
// K-th of N shards cut as fl-sim would (federated.partition, train.seed).
data::TensorDataset client_data(const core::Config& config, const data::DataSplits& d,
                                const std::string& partition) {
  if (partition.empty()) return d.train;
  const auto [k, n] = parse_partition(partition);
  data::PartitionSpec ps;
  ps.kind = config.get_string("federated.partition");
  ps.clients = n;
  ps.alpha = config.get_float("federated.alpha");
  ps.classes_per_client = config.get_int("federated.classes_per_client");
  ps.seed = static_cast<uint64_t>(config.get_int("train.seed"));
  const auto parts = client_shards(d, ps);
  auto [x, y] = data::gather(d.train, parts[k]);
  return data::TensorDataset{x, y};
}

// Ready. A token in use may be this client's own, from before a restart: the server frees it
// once the old session has been silent for its liveness period, so retry for the retry period.
void join(FederationClient& client, const std::string& signature, int64_t examples,
          const std::string& who, const ClientRunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  for (bool said = false;; said = true) {
    try {
      client.ready(signature, examples);
      return;
    } catch (const TokenInUse& e) {
      if (std::chrono::steady_clock::now() - start > retry_period(options)) throw;
      if (!said)
        std::fprintf(stderr, "%s: %s; retrying for up to %g s\n", who.c_str(), e.what(),
                     options.retry_s);
      std::this_thread::sleep_for(milliseconds(1000));
    }
  }
}

// A joined client's life: polls for tasks until the server says it is done, and answers them.
// A failed task is reported to the server and the client carries on; a breach of the client's
// policy ends it.
class ClientSession {
 public:
  ClientSession(FederationClient& client, LocalTrainer& trainer, const data::TensorDataset& data,
                const core::Config& config, const ClientRunOptions& options, std::string who,
                std::function<void()> rejoin)
      : client_(client),
        trainer_(trainer),
        data_(data),
        options_(options),
        who_(std::move(who)),
        seed_(static_cast<uint64_t>(config.get_int("train.seed"))),
        rejoin_(std::move(rejoin)) {}

  // Returns the rounds this client trained in.
  int64_t run() {
    auto last_contact = std::chrono::steady_clock::now();
    for (;;) {
      RemoteTask task;
      try {
        task = client_.next_task();
        last_contact = std::chrono::steady_clock::now();
      } catch (const PeerLost& e) {
        if (std::chrono::steady_clock::now() - last_contact > retry_period(options_)) throw;
        std::this_thread::sleep_for(milliseconds(500));
        continue;
      }
      if (task.kind == RemoteTask::kDone) break;
      if (task.kind == RemoteTask::kWait) continue;
      if (task.kind == RemoteTask::kRejoin) {
        std::fprintf(stderr, "%s: the server restarted; joining again\n", who_.c_str());
        rejoin_();
        secure_.reset();
        continue;
      }
      enforce_policy(task);
      answer(task);
    }
    return rounds_;
  }

 private:
  // The server's settings against this client's own minimums: a breach ends the client
  // (exit 2, naming the flag), before it trains or sends anything.
  void enforce_policy(const RemoteTask& task) {
    try {
      if (task.kind == RemoteTask::kFit) check_fit(options_.policy, task.fit);
      if (task.kind == RemoteTask::kSecAgg && task.secagg.stage == SecAggRequest::kShareKeys)
        check_weight(options_.policy, task.secagg.weight);
    } catch (const InvalidArgument& e) {
      try {
        client_.submit_error(task.task_id, str_cat("refused by the client's policy: ", e.what()));
      } catch (const std::exception&) {
        // Leaving anyway.
      }
      throw;
    }
  }

  void answer(const RemoteTask& task) {
    try {
      if (task.kind == RemoteTask::kFit) {
        fit(task);
      } else {
        KRAB_CHECK_ARG(secure_ != nullptr, "secure aggregation request without a secure round");
        client_.submit_secagg(task.task_id, secure_->handle(task.secagg));
      }
    } catch (const PeerLost& e) {
      // The server went away with this task; the next poll retries for retry_s.
      std::fprintf(stderr, "%s: lost the server (%s); retrying\n", who_.c_str(), e.what());
    } catch (const std::exception& e) {
      // Tell the server now rather than let it wait for the deadline.
      std::fprintf(stderr, "%s: task failed: %s\n", who_.c_str(), e.what());
      try {
        client_.submit_error(task.task_id, e.what());
      } catch (const std::exception&) {
        // The task is void anyway (late, or the server is gone).
      }
    }
  }

  void fit(const RemoteTask& task) {
    RoundOptions ro;
    ro.proximal_mu = task.fit.proximal_mu;
    ro.clip_norm = task.fit.clip_norm;
    ro.local_noise_std = task.fit.local_noise_std;
    ro.seed = data::derive_seed(seed_, static_cast<uint64_t>(task.fit.round));
    LocalResult r = trainer_.train(task.fit.global, data_, ro);
    FitReply reply;
    reply.num_examples = r.num_examples;
    reply.mean_loss = r.mean_loss;
    if (task.fit.secure) {
      secure_ = std::make_unique<SecureClient>(task.fit, r.update);
      reply.secagg = secure_->advertise();
    } else {
      reply.update = r.update;
    }
    client_.submit_fit(task.task_id, reply);
    ++rounds_;
    std::fprintf(stderr, "%s: round %lld: %lld steps, loss %.4f\n", who_.c_str(),
                 static_cast<long long>(task.fit.round), static_cast<long long>(r.steps),
                 r.mean_loss);
  }

  FederationClient& client_;
  LocalTrainer& trainer_;
  const data::TensorDataset& data_;
  const ClientRunOptions& options_;
  const std::string who_;
  const uint64_t seed_;  // train.seed: each round's batch order derives from it
  std::function<void()> rejoin_;
  std::unique_ptr<SecureClient> secure_;  // this round's, when it is a secure one
  int64_t rounds_ = 0;
};

}  // namespace

int64_t run_fl_client(const ClientRunOptions& options) {
  torch::set_num_threads(options.threads);
  FederationClient client(client_transport(options));
  const FederationClient::Hello hello = say_hello(client, options);
  const core::Config config =
      client_job(hello.config_yaml, hello.model_sha256, {options.data, options.model});
  const std::string who = "krab[" + hello.client_name + "]";
  data::DataSplits d = train::load_data(config);
  const data::TensorDataset mine = client_data(config, d, options.partition);
  d.test.reset();
  const models::ModelSpec spec = train::model_spec(config, d);
  torch::manual_seed(0);
  LocalTrainer trainer(config, spec);
  const std::string signature = train::model_signature(trainer.model());
  KRAB_CHECK_ARG(signature == hello.model_signature, who, ": this data gives a model of shape ",
                 signature, " but the server's model is ", hello.model_signature);
  train::dry_run(trainer.model(), d, config);  // before joining; changes no state
  auto rejoin = [&] { join(client, signature, mine.size(), who, options); };
  rejoin();
  std::fprintf(stderr, "%s: joined %s with %lld examples\n", who.c_str(), options.server.c_str(),
               static_cast<long long>(mine.size()));

  const int64_t rounds = ClientSession(client, trainer, mine, config, options, who, rejoin).run();
  std::fprintf(stderr, "%s: done after %lld round(s)\n", who.c_str(),
               static_cast<long long>(rounds));
  return rounds;
}

}  // namespace krab::federated
