// sync.mode: async — training through parameter servers (sync/shard.h has the semantics).
//
// Processes: krab's launcher on node 0 starts sync.servers server processes beside the
// workers. Each server builds the model from the seed exactly as the workers do, keeps its
// shard of the flat parameters and the optimizer state for it, and publishes its address in
// the rendezvous store ("krab/ps/<i>"); it listens on loopback unless the job spans nodes,
// and every call must carry the job secret (sync/param_server.h). Workers need no collective group at all: a worker
// that dies takes nothing down with it. Server 0, the chief, waits until every worker has
// finished or been counted out, collects the other shards, evaluates the model, and writes
// model.pt and the report; it also draws the progress bar (in steps of W pushes).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/errors.h"
#include "core/fs.h"
#include "core/progress.h"
#include "sync/param_server.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/schedule.h"
#include "train/trainer.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string server_key(int shard) { return str_cat("krab/ps/", shard); }

std::chrono::milliseconds comm_timeout(const core::Config& c) {
  return std::chrono::milliseconds(static_cast<int64_t>(c.get_float("comm.timeout_s") * 1000));
}

int64_t flat_numel(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

void flatten_into(const std::vector<at::Tensor>& ts, at::Tensor& flat, bool grads) {
  int64_t off = 0;
  for (const auto& p : ts) {
    auto dst = flat.narrow(0, off, p.numel());
    const at::Tensor& src = grads ? p.grad() : p;
    if (src.defined())
      dst.copy_(src.detach().reshape({-1}));
    else
      dst.zero_();
    off += p.numel();
  }
}

void unflatten_from(const at::Tensor& flat, std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (auto& p : params) {
    p.detach().copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
}

std::string human(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : "%.1f", v);
  return buf;
}

}  // namespace

void check_async_options(const core::Config& c) {
  if (c.get_string("sync.mode") != "async") return;
  KRAB_CHECK_ARG(c.get_int("sync.servers") >= 1,
                 "sync.servers must be >= 1 for sync.mode 'async' (the parameter servers that "
                 "apply the gradients), got ", c.get_int("sync.servers"));
  KRAB_CHECK_ARG(c.get_string("comm.backend") == "gloo",
                 "comm.backend '", c.get_string("comm.backend"),
                 "': sync.mode 'async' talks to its parameter servers over gRPC and is started "
                 "by krab's own launcher; use comm.backend: gloo");
  KRAB_CHECK_ARG(c.get_int("checkpoint.every_steps") == 0 && !c.get_bool("checkpoint.resume"),
                 "checkpoint.every_steps / checkpoint.resume: sync.mode 'async' writes model.pt "
                 "at the end but no resumable checkpoints yet (the optimizer state lives on the "
                 "servers)");
}

nlohmann::json run_async_worker(const core::Config& c, const comm::WorldInfo& world,
                                const WorkerOptions& options) {
  torch::set_num_threads(static_cast<int>(c.get_int("train.threads_per_worker")));
  const int W = world.size, rank = world.rank;
  const int S = static_cast<int>(c.get_int("sync.servers"));
  const int64_t batch = c.get_int("data.batch_size");
  const int64_t accum = c.get_int("train.grad_accum");
  const int64_t seed = c.get_int("train.seed");
  const int64_t eval_every = c.get_int("train.eval_every");

  data::DataSplits d = load_data(c);
  data::GlobalBatchSampler sampler(d.train.size(), batch * W, static_cast<uint64_t>(seed));
  torch::manual_seed(static_cast<uint64_t>(seed));
  auto model = models::make_model(model_spec(c, d));
  std::vector<at::Tensor> params = model->parameters();
  const int64_t numel = flat_numel(params);

  auto store = comm::connect_store(world.rendezvous, comm_timeout(c));
  std::vector<std::string> addresses;
  for (int i = 0; i < S; ++i) {
    const auto v = store->get(server_key(i));  // waits for the server to publish
    addresses.emplace_back(v.begin(), v.end());
  }
  sync::PsClient client(addresses, rank, numel, comm_timeout(c), world.rendezvous.secret);
  at::Tensor flat = torch::zeros({numel}), grad = torch::zeros({numel});
  sync::PullResult next = client.pull(flat);
  unflatten_from(flat, params);

  // The servers decide how much each worker does: server 0 hands out data tickets (slice
  // ticket % W of global batch ticket / W) until the job's W x steps gradients are in, then
  // says stop. A slow worker does fewer steps; nobody waits for it at the end.
  const Straggler straggler(c, rank);
  sync::WorkerSummary summary;
  const auto t_loop = Clock::now();
  double last_loss = 0;
  int64_t done = 0, next_eval = eval_every;

  // Worker 0 records time-to-accuracy points: at every train.eval_every global steps it keeps
  // a copy of the parameters it just pulled, and evaluates the copies after training. An
  // evaluation inside the loop would make worker 0 a straggler (its next gradient stale by
  // the whole evaluation, and with max_staleness everyone waiting for it), and one in a thread
  // beside training would take CPU from it. Memory: one parameter copy per evaluation.
  struct Snapshot {
    int64_t global_step;
    double trained_seconds;
    at::Tensor values;
  };
  std::vector<Snapshot> snapshots;
  const bool evaluates = rank == 0 && eval_every > 0 && d.test;
  model->train();
  while (!next.stop) {
    KRAB_CHECK(next.ticket >= 0, "parameter server 0 gave no data ticket");
    const int64_t global_step = next.ticket / W;
    const int slice = static_cast<int>(next.ticket % W);
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    double step_loss = 0;
    for (int64_t m = 0; m < accum; ++m) {
      const auto t_compute = Clock::now();
      auto [x, y] = data::gather(d.train, sampler.indices(global_step * accum + m, slice, W));
      auto loss = model->loss(model->forward(x), y);
      (accum > 1 ? loss / static_cast<double>(accum) : loss).backward();
      step_loss += loss.item<double>() / accum;
      straggler.after_compute(Clock::now() - t_compute);
    }
    last_loss = step_loss;
    flatten_into(params, grad, /*grads=*/true);
    next = client.push_pull(grad, flat);
    ++done;
    if (next.stop) break;
    unflatten_from(flat, params);
    // Evaluate when the job's progress (the global step of the next ticket) passes a multiple
    // of train.eval_every.
    if (evaluates && next.ticket / W >= next_eval) {
      next_eval = (next.ticket / W / eval_every + 1) * eval_every;
      snapshots.push_back({next.ticket / W,
                           std::chrono::duration<double>(Clock::now() - t_loop).count(),
                           flat.clone()});
    }
  }
  summary.steps = done;
  summary.seconds = std::chrono::duration<double>(Clock::now() - t_loop).count();
  summary.wait_seconds = client.wait_seconds();
  summary.final_loss = last_loss;
  if (!snapshots.empty()) {
    model->eval();
    for (const Snapshot& snap : snapshots) {
      client.pull(flat);  // "still here": the servers count out workers silent for
                          // sync.worker_timeout_s, and one evaluation must take less
      unflatten_from(snap.values, params);
      const auto [correct, total] = count_correct(*model, *d.test, 0, d.test->size());
      const double acc = total > 0 ? static_cast<double>(correct) / total : 0;
      summary.evals.push_back({snap.global_step, snap.trained_seconds, acc});
      std::fprintf(stderr, "krab: step %lld (%.1f s of training): test accuracy %.4f\n",
                   static_cast<long long>(snap.global_step), snap.trained_seconds, acc);
    }
  }
  client.leave(summary);
  (void)options;
  return {{"rank", rank}, {"steps", done}, {"bytes_sent", client.bytes_sent()}};
}

nlohmann::json run_param_server(const core::Config& c, int shard, const comm::Endpoint& rendezvous,
                                int workers, const WorkerOptions& options) {
  const auto t_start = Clock::now();
  torch::set_num_threads(static_cast<int>(c.get_int("train.threads_per_worker")));
  const int W = workers, S = static_cast<int>(c.get_int("sync.servers"));
  const int64_t batch = c.get_int("data.batch_size");
  const int64_t accum = c.get_int("train.grad_accum");
  const int64_t seed = c.get_int("train.seed");

  data::DataSplits d = load_data(c);
  data::GlobalBatchSampler sampler(d.train.size(), batch * W, static_cast<uint64_t>(seed));
  const int64_t steps = total_steps(c, sampler, accum);
  torch::manual_seed(static_cast<uint64_t>(seed));  // the workers' initial model, bit for bit
  auto model = models::make_model(model_spec(c, d));
  std::vector<at::Tensor> params = model->parameters();
  const int64_t numel = flat_numel(params);
  sync::check_shard_fits(numel, S);
  at::Tensor flat = torch::zeros({numel});
  flatten_into(params, flat, /*grads=*/false);
  const sync::ShardRange range = sync::shard_range(numel, shard, S);

  sync::ShardOptions so;
  so.workers = W;
  so.max_staleness = static_cast<int>(c.get_int("sync.max_staleness"));
  const int64_t aggregate = c.get_int("sync.aggregate");
  so.aggregate = aggregate == 0 ? W : static_cast<int>(aggregate);
  so.staleness_damping = c.get_bool("sync.staleness_damping");
  so.extrapolate = c.get_bool("sync.extrapolate") && so.max_staleness != 0;  // s = 0: not stale
  so.worker_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(c.get_float("sync.worker_timeout_s") * 1000));
  const Schedule schedule = parse_schedule(c.get_string("train.lr_schedule"));
  const double base_lr = c.get_float("train.optimizer.lr");
  const int64_t warmup_lr = c.get_int("train.warmup_steps");
  so.lr_at = [=](int64_t t) {
    return learning_rate(schedule, base_lr, std::min(t, steps - 1), steps, warmup_lr);
  };
  const int64_t warm_steps = std::min<int64_t>(10, std::max<int64_t>(1, steps / 10));
  so.warmup_pushes = W * warm_steps;
  so.total_pushes = W * steps;
  so.issue_tickets = shard == 0;
  auto state = std::make_shared<sync::ShardState>(
      so, flat.narrow(0, range.offset, range.numel),
      [&c](std::vector<at::Tensor> ps) { return make_optimizer(c, std::move(ps)); });
  // One node (a loopback or file rendezvous): on loopback only. Otherwise the workers of the
  // other nodes must reach it, and the job secret keeps out everyone else (sync/param_server.h).
  sync::Access access;
  access.host = rendezvous.file.empty() && !comm::is_loopback(rendezvous.host) ? "0.0.0.0"
                                                                               : "127.0.0.1";
  access.secret = rendezvous.secret;
  sync::ParamServer server(state, 0, access);
  auto store = comm::connect_store(rendezvous, comm_timeout(c));
  const std::string address = str_cat(rendezvous.host, ":", server.port());
  store->set(server_key(shard), std::vector<uint8_t>(address.begin(), address.end()));

  if (shard != 0) {
    // Serve until the chief has collected this shard (the launcher stops us if it dies).
    while (!server.wait_finish_answered(std::chrono::seconds(1))) {
    }
    return {{"shard", shard}};
  }

  // The chief: progress, then the final model.
  const bool show = options.show_progress;
  core::ProgressBar bar("train", steps);
  while (!state->wait_done(std::chrono::milliseconds(500)))
    if (show) {
      const auto st = state->stats();
      const double rate = st.seconds_after_warmup > 0
                              ? st.pushes_after_warmup * batch * accum / st.seconds_after_warmup
                              : 0;
      int dead = 0;
      for (const auto& w : st.workers) dead += w.status == sync::WorkerState::Status::kDead;
      bar.update(std::min(steps, st.pushes / W),
                 str_cat(human(rate), " samples/s | staleness max ", st.max_staleness_seen,
                         dead ? str_cat(" | ", dead, " worker(s) counted out") : std::string()));
    }
  const sync::ShardStats st = state->stats();
  uint64_t bytes_in = server.bytes_received(), bytes_out = server.bytes_sent();
  std::vector<at::Tensor> parts{state->values()};
  for (int i = 1; i < S; ++i) {
    const auto v = store->get(server_key(i));
    sync::FinalShard f = sync::finish_shard(std::string(v.begin(), v.end()), comm_timeout(c),
                                            rendezvous.secret);
    KRAB_CHECK(f.values.numel() == sync::shard_range(numel, i, S).numel, "shard ", i, " size");
    parts.push_back(f.values);
    bytes_in += f.bytes_received;
    bytes_out += f.bytes_sent;
  }
  at::Tensor final_flat = torch::cat(parts);
  unflatten_from(final_flat, params);

  const double samples_per_sec =
      st.seconds_after_warmup > 0 ? st.pushes_after_warmup * batch * accum / st.seconds_after_warmup
                                  : 0;
  if (show)
    bar.finish(str_cat(samples_per_sec > 0 ? human(samples_per_sec) + " samples/s"
                                           : std::string("samples/s not measured"),
                       " | staleness max ", st.max_staleness_seen));

  double accuracy = -1;
  if (d.test) {
    model->eval();
    const auto [correct, total] = count_correct(*model, *d.test, 0, d.test->size());
    accuracy = total > 0 ? static_cast<double>(correct) / total : 0;
  }
  nlohmann::json per_worker = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();
  double loss_sum = 0, train_secs = 0;
  int finished = 0, lost = 0, with_loss = 0;  // a worker told to stop at once has no loss
  for (int w = 0; w < W; ++w) {
    const auto& ws = st.workers[w];
    const bool ok = ws.status == sync::WorkerState::Status::kFinished;
    finished += ok;
    lost += !ok;
    if (ok) {
      if (ws.summary.steps > 0) {
        loss_sum += ws.summary.final_loss;
        ++with_loss;
      }
      train_secs = std::max(train_secs, ws.summary.seconds);
    } else {
      std::fprintf(stderr, "krab: worker %d was counted out at step %lld; training went on "
                   "without it\n", w, static_cast<long long>(ws.clock));
    }
    per_worker.push_back({{"rank", w},
                          {"status", sync::status_name(ws.status)},
                          {"steps", ws.clock},
                          {"steps_when_first_finished", ws.clock_when_first_finished},
                          {"times_counted_out", ws.times_counted_out},
                          {"seconds", ws.summary.seconds},
                          {"wait_seconds", ws.summary.wait_seconds},
                          {"predicted_exactly", ws.predicted_exactly}});
    if (w == 0)
      for (const auto& e : ws.summary.evals)
        evals.push_back({{"step", e.step}, {"seconds", e.seconds},
                         {"test_accuracy", e.test_accuracy}});
  }

  const std::string run_dir = run_directory(c);
  const std::string model_pt = (fs::path(run_dir) / "model.pt").string();
  fs::create_directories(run_dir);
  save_model_pt(model_pt, *model);
  nlohmann::json report;
  report["workers"] = W;
  report["backend"] = "grpc";
  report["global_batch"] = batch * W * accum;
  report["steps"] = steps;
  report["start_step"] = 0;
  report["epochs"] = static_cast<double>(st.pushes * accum) / W / sampler.steps_per_epoch();
  set_samples_per_sec(report, samples_per_sec, st.pushes_after_warmup);
  report["wall_seconds"] = std::chrono::duration<double>(Clock::now() - t_start).count();
  report["final_loss"] = with_loss > 0 ? loss_sum / with_loss : 0.0;
  if (accuracy >= 0) {
    report["test_accuracy"] = accuracy;
    evals.push_back({{"step", steps}, {"seconds", train_secs}, {"test_accuracy", accuracy}});
  }
  report["train_seconds"] = train_secs;
  report["evals"] = evals;
  // Every byte the job sent: the workers' pushes (what the servers received) and the
  // servers' replies, as protobuf message sizes.
  report["bytes_sent"] = bytes_in + bytes_out;
  report["bytes_sent_steps"] = bytes_in + bytes_out;
  report["bytes_sent_by_op"] = {{"push", bytes_in}, {"pull", bytes_out}};
  report["gradient_bytes"] = static_cast<uint64_t>(numel * 4);
  report["compression"] = "none";
  report["sync_mode"] = "async";
  report["async"] = {{"servers", S},
                     {"max_staleness", c.get_int("sync.max_staleness")},
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
                     {"workers_lost", lost},
                     {"per_worker", per_worker}};
  report["checkpoint"] = model_pt;
  report["state"] = "";
  report["config"] = c.to_json();
  if (!options.report_path.empty())
    core::write_file_atomic(options.report_path, core::dump_json(report) + "\n");
  return report;
}

}  // namespace krab::train
