// sync.mode: async — the parameter-server side (sync/shard.h has the semantics; the worker is
// an engine, sync/ps_worker.h, driven by the same Trainer loop as every other mode).
//
// Processes: krab's launcher on node 0 starts sync.servers server processes beside the
// workers. Each server builds the model from the seed exactly as the workers do, keeps its
// shard of the flat parameters and the optimizer state for it, and publishes its address in
// the rendezvous store ("krab/ps/<i>"); it listens on loopback unless the job spans nodes,
// and every call must carry the job secret (sync/param_server.h). Server 0, the chief, waits
// until every worker has finished or been counted out, collects the other shards, evaluates
// the model, and writes model.pt and the report; it also draws the progress bar (in steps of
// W pushes).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "comm/store.h"
#include "core/errors.h"
#include "core/flat.h"
#include "core/fs.h"
#include "sync/param_server.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/options.h"
#include "train/report.h"
#include "train/schedule.h"
#include "train/trainer.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string server_key(int shard) { return str_cat("krab/ps/", shard); }
// sync.replicas: 1 — where shard `shard`'s mirror listens (on server shard + 1 mod S).
std::string mirror_key(int shard) { return str_cat("krab/ps/", shard, "/mirror"); }

std::chrono::milliseconds comm_timeout(const core::Config& c) {
  return std::chrono::milliseconds(static_cast<int64_t>(c.get_float("comm.timeout_s") * 1000));
}

// What every server builds the same way: the model from the seed (the workers' initial model,
// bit for bit), its flat parameters, the number of steps.
struct ServerJob {
  const core::Config& c;
  TrainOptions o;
  int workers = 0, servers = 0;
  data::DataSplits d;
  std::unique_ptr<data::GlobalBatchSampler> sampler;
  int64_t steps = 0;
  std::shared_ptr<models::Model> model;
  std::vector<at::Tensor> params;
  int64_t numel = 0;
  Metric metric = Metric::kAccuracy;

  ServerJob(const core::Config& config, int w)
      : c(config), o(TrainOptions::from_config(config)), workers(w) {
    torch::set_num_threads(o.threads);
    servers = static_cast<int>(c.get_int("sync.servers"));
    d = load_data(c, DataResidency::kInMemory, LoadNotes::kQuiet);  // the workers say it
    sampler = std::make_unique<data::GlobalBatchSampler>(d.train.size(), o.batch * workers,
                                                         static_cast<uint64_t>(o.seed));
    steps = total_steps(c, *sampler, o.micro_batches);
    torch::manual_seed(static_cast<uint64_t>(o.seed));
    model = models::make_model(model_spec(c, d));
    metric = resolve_metric(c, *model, d);
    params = model->parameters();
    numel = core::total_numel(params);
    sync::check_shard_fits(numel, servers);
  }
};

sync::ShardOptions shard_options(const ServerJob& job, int shard) {
  const core::Config& c = job.c;
  const int W = job.workers;
  sync::ShardOptions so;
  so.workers = W;
  so.max_staleness = static_cast<int>(c.get_int("sync.max_staleness"));
  const int64_t aggregate = c.get_int("sync.aggregate");
  so.aggregate = aggregate == 0 ? W : static_cast<int>(aggregate);
  so.staleness_damping = c.get_bool("sync.staleness_damping");
  so.extrapolate = c.get_bool("sync.extrapolate") && so.max_staleness != 0;  // s = 0: not stale
  so.worker_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(c.get_float("sync.worker_timeout_s") * 1000));
  const TrainOptions o = job.o;
  const int64_t steps = job.steps;
  so.lr_at = [o, steps](int64_t t) {
    return learning_rate(o.schedule, o.base_lr, std::min(t, steps - 1), steps, o.lr_warmup_steps);
  };
  so.warmup_pushes = W * measurement_warmup(steps);
  so.total_pushes = W * steps;
  so.issue_tickets = shard == 0;
  return so;
}

// The chief's progress bar while the workers train: rate, staleness, workers counted out.
void draw_progress_until_done(const ServerJob& job, sync::ShardState& state, bool show) {
  const int64_t per_push = job.o.batch * job.o.micro_batches;
  auto sink = std::make_shared<ProgressSink>(
      "train", job.steps, [](const ProgressSink::Gauges& g, bool final) {
        const double rate = g.at("samples_per_sec");
        const int dead = static_cast<int>(g.at("workers_counted_out"));
        const std::string staleness =
            str_cat("staleness max ", static_cast<int64_t>(g.at("max_staleness_seen")));
        if (final)
          return str_cat(rate > 0 ? human(rate) + " samples/s" : "samples/s not measured", " | ",
                         staleness);
        return str_cat(human(rate), " samples/s | ", staleness,
                       dead ? str_cat(" | ", dead, " worker(s) counted out") : std::string());
      });
  core::Events events;
  if (show) events.add(sink);
  const auto publish = [&](const sync::ShardStats& st) {
    const double rate = st.seconds_after_warmup > 0
                            ? st.pushes_after_warmup * per_push / st.seconds_after_warmup
                            : 0;
    int dead = 0;
    for (const auto& w : st.workers) dead += w.status == sync::WorkerState::Status::kDead;
    const int64_t done = std::min(job.steps, st.pushes / job.workers);
    events.gauge("samples_per_sec", rate, done);
    events.gauge("max_staleness_seen", static_cast<double>(st.max_staleness_seen), done);
    events.gauge("workers_counted_out", dead, done);
    return done;
  };
  while (!state.wait_done(std::chrono::milliseconds(500)))
    events.step(publish(state.stats()), job.steps);
  publish(state.stats());
  if (show) sink->finish();
}

// The other shards' final values, collected by the chief, and every server's traffic.
struct Collected {
  at::Tensor flat;
  uint64_t bytes_in = 0, bytes_out = 0;
  int failovers = 0;  // shards whose mirror answered for their dead primary
};

Collected collect_shards(const ServerJob& job, const sync::ParamServer& server,
                         sync::ShardState& state, c10d::Store& store,
                         const comm::Endpoint& rendezvous) {
  Collected out;
  out.bytes_in = server.bytes_received();
  out.bytes_out = server.bytes_sent();
  std::vector<at::Tensor> parts{state.values()};
  for (int i = 1; i < job.servers; ++i) {
    const auto v = store.get(server_key(i));
    std::string mirror;
    if (job.c.get_int("sync.replicas") > 0) {
      const auto m = store.get(mirror_key(i));
      mirror.assign(m.begin(), m.end());
    }
    sync::FinalShard f = sync::finish_shard(std::string(v.begin(), v.end()), comm_timeout(job.c),
                                            rendezvous.secret, mirror);
    out.failovers += f.promoted ? 1 : 0;
    KRAB_CHECK(f.values.numel() == sync::shard_range(job.numel, i, job.servers).numel, "shard ", i,
               " size");
    parts.push_back(f.values);
    out.bytes_in += f.bytes_received;
    out.bytes_out += f.bytes_sent;
  }
  out.flat = torch::cat(parts);
  return out;
}

// Per-worker rows, worker 0's evaluations, and the mean final loss of the finished workers.
struct WorkerTotals {
  nlohmann::json per_worker = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();
  double final_loss = 0, train_seconds = 0;
  int lost = 0;
};

WorkerTotals worker_totals(const sync::ShardStats& st, int workers, Metric metric) {
  WorkerTotals t;
  double loss_sum = 0;
  int with_loss = 0;  // a worker told to stop at once has no loss
  for (int w = 0; w < workers; ++w) {
    const auto& ws = st.workers[w];
    if (ws.status == sync::WorkerState::Status::kFinished) {
      if (ws.summary.steps > 0) {
        loss_sum += ws.summary.final_loss;
        ++with_loss;
      }
      t.train_seconds = std::max(t.train_seconds, ws.summary.seconds);
    } else {
      ++t.lost;
      std::fprintf(stderr,
                   "krab: worker %d was counted out at step %lld; training went on "
                   "without it\n",
                   w, static_cast<long long>(ws.clock));
    }
    t.per_worker.push_back({{"rank", w},
                            {"status", sync::status_name(ws.status)},
                            {"steps", ws.clock},
                            {"steps_when_first_finished", ws.clock_when_first_finished},
                            {"times_counted_out", ws.times_counted_out},
                            {"seconds", ws.summary.seconds},
                            {"wait_seconds", ws.summary.wait_seconds},
                            {"predicted_exactly", ws.predicted_exactly}});
    if (w == 0)
      for (const auto& e : ws.summary.evals)
        t.evals.push_back(
            {{"step", e.step},
             {"seconds", e.seconds},
             {metric_key(metric), metric == Metric::kLoss ? e.test_loss : e.test_accuracy}});
  }
  t.final_loss = with_loss > 0 ? loss_sum / with_loss : 0.0;
  return t;
}

nlohmann::json async_fields(const ServerJob& job, const sync::ShardOptions& so,
                            const sync::ShardStats& st, const WorkerTotals& t, int failovers) {
  return {{"servers", job.servers},
          {"replicas", job.c.get_int("sync.replicas")},
          {"failovers", failovers},
          {"max_staleness", job.c.get_int("sync.max_staleness")},
          {"aggregate", so.aggregate},
          {"extrapolate", so.extrapolate},
          {"pushes", st.pushes},
          {"updates", st.version},
          {"dropped", st.dropped},
          {"max_staleness_seen", st.max_staleness_seen},
          {"mean_staleness", st.mean_staleness},
          {"predicted_exactly", st.predicted_exactly},
          {"mean_prediction_error", st.mean_prediction_error},
          {"max_lead", st.max_lead},
          {"workers_lost", t.lost},
          {"per_worker", t.per_worker}};
}

// The chief's report, from the shard statistics and the collected model.
nlohmann::json chief_report(ServerJob& job, const sync::ShardOptions& so,
                            const sync::ShardStats& st, const Collected& col,
                            Clock::time_point t_start) {
  core::unflatten_into(col.flat, job.params);
  RunOutcome out;
  if (const data::Dataset* test = job.d.testing()) {
    job.model->eval();
    const int64_t n = evaluation_size(test->size(), job.o.eval_examples);
    const double value = evaluate_range(*job.model, job.metric, *test, 0, n).value();
    if (job.o.eval_examples > 0) out.eval_examples = n;
    if (job.metric == Metric::kLoss)
      out.test_loss = value;
    else
      out.test_accuracy = value;
  }
  const WorkerTotals t = worker_totals(st, job.workers, job.metric);
  const std::string run_dir = run_directory(job.c);
  out.checkpoint = (fs::path(run_dir) / "model.pt").string();
  core::make_dirs(run_dir);  // 0700, as every run directory
  save_model_pt(out.checkpoint, *job.model);
  const int64_t per_push = job.o.batch * job.o.micro_batches;
  out.workers = job.workers;
  out.global_batch = per_push * job.workers;
  out.steps = job.steps;
  out.epochs = static_cast<double>(st.pushes * job.o.micro_batches) / job.workers /
               job.sampler->steps_per_epoch();
  out.measured_steps = st.pushes_after_warmup;
  out.samples_per_sec =
      st.seconds_after_warmup > 0 ? st.pushes_after_warmup * per_push / st.seconds_after_warmup : 0;
  out.wall_seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  out.final_loss = t.final_loss;
  out.train_seconds = t.train_seconds;
  out.evals = t.evals;
  // Every byte the job sent: the workers' pushes (what the servers received) and the
  // servers' replies, as protobuf message sizes.
  out.bytes_sent = out.bytes_sent_steps = col.bytes_in + col.bytes_out;
  out.bytes_sent_by_op = {{"push", col.bytes_in}, {"pull", col.bytes_out}};
  out.gradient_bytes = static_cast<uint64_t>(job.numel * 4);
  out.sync_mode = sync_mode_name(SyncMode::kAsync);
  const nlohmann::json engine = {{"backend", "grpc"},
                                 {"compression", "none"},
                                 {"async", async_fields(job, so, st, t, col.failovers)}};
  return make_report(out, engine, job.c.to_json());
}

}  // namespace

void check_async_options(const core::Config& c) {
  const int64_t replicas = c.get_int("sync.replicas");
  KRAB_CHECK_ARG(replicas == 0 || c.get_string("sync.mode") == "async", "sync.replicas ", replicas,
                 " mirrors parameter-server shards; it needs sync.mode: async (sync.mode is '",
                 c.get_string("sync.mode"), "')");
  if (c.get_string("sync.mode") != "async") return;
  KRAB_CHECK_ARG(replicas == 0 || c.get_int("sync.servers") >= 2, "sync.replicas ", replicas,
                 " puts each shard's mirror on the next server; it needs sync.servers >= 2, got ",
                 c.get_int("sync.servers"));
  KRAB_CHECK_ARG(c.get_int("sync.servers") >= 1,
                 "sync.servers must be >= 1 for sync.mode 'async' (the parameter servers that "
                 "apply the gradients), got ",
                 c.get_int("sync.servers"));
  KRAB_CHECK_ARG(c.get_string("comm.backend") == "gloo", "comm.backend '",
                 c.get_string("comm.backend"),
                 "': sync.mode 'async' talks to its parameter servers over gRPC and is started "
                 "by krab's own launcher; use comm.backend: gloo");
  KRAB_CHECK_ARG(c.get_int("checkpoint.every_steps") == 0 && !c.get_bool("checkpoint.resume"),
                 "checkpoint.every_steps / checkpoint.resume: sync.mode 'async' writes model.pt "
                 "at the end but no resumable checkpoints yet (the optimizer state lives on the "
                 "servers)");
}

namespace {

// sync.replicas: 1 — this server's mirror of shard `shard` (the one before it), published so
// that the primary of that shard and the workers find it.
struct MirrorOfPrevious {
  std::shared_ptr<sync::ShardState> state;
  std::unique_ptr<sync::ParamServer> server;
};

MirrorOfPrevious serve_mirror(const ServerJob& job, const at::Tensor& flat, int shard,
                              const sync::Access& access, c10d::Store& store,
                              const comm::Endpoint& rendezvous) {
  const int mirrored = (shard + job.servers - 1) % job.servers;
  const sync::ShardRange range = sync::shard_range(job.numel, mirrored, job.servers);
  sync::ShardOptions so = shard_options(job, mirrored);
  so.mirror = true;
  MirrorOfPrevious m;
  // Built from the seed as the primary is: the two start equal and replay keeps them so.
  m.state = std::make_shared<sync::ShardState>(
      so, flat.narrow(0, range.offset, range.numel),
      [&job](std::vector<at::Tensor> ps) { return make_optimizer(job.c, std::move(ps)); });
  m.server = std::make_unique<sync::ParamServer>(m.state, 0, access);
  const std::string address = str_cat(rendezvous.host, ":", m.server->port());
  store.set(mirror_key(mirrored), std::vector<uint8_t>(address.begin(), address.end()));
  return m;
}

}  // namespace

nlohmann::json run_param_server(const core::Config& c, int shard, const comm::Endpoint& rendezvous,
                                int workers, const WorkerOptions& options) {
  const auto t_start = Clock::now();
  ServerJob job(c, workers);
  at::Tensor flat = core::flatten(job.params);
  const sync::ShardRange range = sync::shard_range(job.numel, shard, job.servers);
  sync::ShardOptions so = shard_options(job, shard);
  // One node (a loopback or file rendezvous): on loopback only. Otherwise the workers of the
  // other nodes must reach it, and the job secret keeps out everyone else (sync/param_server.h).
  sync::Access access;
  access.host =
      rendezvous.file.empty() && !comm::is_loopback(rendezvous.host) ? "0.0.0.0" : "127.0.0.1";
  access.secret = rendezvous.secret;
  auto store = comm::connect_store(rendezvous, comm_timeout(c));
  MirrorOfPrevious mirror;
  std::shared_ptr<sync::Replicator> link;
  if (c.get_int("sync.replicas") > 0) {
    // Mirror first, then wait for ours: every server publishes before it waits, so none waits
    // on another that waits.
    mirror = serve_mirror(job, flat, shard, access, *store, rendezvous);
    const auto v = store->get(mirror_key(shard));
    link = std::make_shared<sync::Replicator>(
        shard, sync::mirror_sender(std::string(v.begin(), v.end()), comm_timeout(c), access.secret),
        range.numel * 4);
    so.journal = link;
  }
  auto state = std::make_shared<sync::ShardState>(
      so, flat.narrow(0, range.offset, range.numel),
      [&c](std::vector<at::Tensor> ps) { return make_optimizer(c, std::move(ps)); });
  sync::ParamServer server(state, 0, access, link, 2 * comm_timeout(c));
  const std::string address = str_cat(rendezvous.host, ":", server.port());
  store->set(server_key(shard), std::vector<uint8_t>(address.begin(), address.end()));

  if (shard != 0) {
    // Serve until the chief has collected this shard, and the mirrored one too if its primary
    // died and the chief collects it here (the launcher stops us if the chief dies).
    const auto mirror_collected = [&] {
      return !mirror.state || !mirror.state->stats().promoted ||
             mirror.server->wait_finish_answered(std::chrono::milliseconds(0));
    };
    while (!server.wait_finish_answered(std::chrono::seconds(1)) || !mirror_collected()) {
    }
    return {{"shard", shard}};
  }
  draw_progress_until_done(job, *state, options.show_progress);
  const sync::ShardStats st = state->stats();
  const Collected col = collect_shards(job, server, *state, *store, rendezvous);
  nlohmann::json report = chief_report(job, so, st, col, t_start);
  if (!options.report_path.empty())
    core::write_file_atomic(options.report_path, core::dump_json(report) + "\n",
                            core::FileAccess::kShared);
  return report;
}

}  // namespace krab::train
