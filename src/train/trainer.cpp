#include "train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "compress/hooks.h"
#include "core/errors.h"
#include "core/fs.h"
#include "core/seal.h"
#include "core/progress.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "models/model.h"
#include "parallel/data_parallel.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/schedule.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Rank 0's bytes reach every rank (checkpoint resume without a shared file system).
std::string broadcast_bytes(comm::Communicator& comm, std::string bytes) {
  auto len = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
  comm.broadcast(len, 0)->wait();
  auto buf = torch::empty({len.item<int64_t>()}, torch::kUInt8);
  if (comm.rank() == 0) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
  comm.broadcast(buf, 0)->wait();
  return std::string(static_cast<const char*>(buf.data_ptr()), buf.numel());
}

// Accuracy on rank `rank`'s shard of the test split, summed over ranks.
double evaluate(models::Model& model, const data::TensorDataset& test, comm::Communicator& comm) {
  const int64_t n = test.size();
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  const auto [correct, total] = count_correct(model, test, lo, hi);
  auto counts = torch::tensor({static_cast<double>(correct), static_cast<double>(total)},
                              torch::kFloat64);
  comm.allreduce(counts)->wait();
  return counts[1].item<double>() > 0 ? counts[0].item<double>() / counts[1].item<double>() : 0;
}

std::string human(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : "%.1f", v);
  return buf;
}


compress::CompressionOptions compression_options(const core::Config& c) {
  compress::CompressionOptions o;
  o.name = c.get_string("comm.compression");
  o.ratio = c.get_float("comm.ratio");
  o.rank = c.get_int("comm.rank");
  o.chunk = c.get_int("comm.chunk");
  // The key's default (hadamard) is onebit's; other compressors take it only when it is named.
  o.rotation = o.name == "onebit" || c.is_set("comm.rotation") ? c.get_string("comm.rotation")
                                                               : "none";
  o.error_feedback = c.get_bool("comm.error_feedback");
  o.warmup_steps = c.get_int("comm.compress_warmup_steps");
  o.min_numel = c.get_int("comm.compress_min_numel");
  o.momentum = c.get_float("comm.momentum_correction");
  o.clip_norm = c.get_float("comm.clip_norm");
  o.seed = static_cast<uint64_t>(c.get_int("train.seed"));
  compress::validate(o);
  KRAB_CHECK_ARG(o.name == "none" || c.get_string("sync.mode") == "sync", "comm.compression '",
                 o.name, "' compresses the gradients of sync.mode 'sync'; sync.mode '",
                 c.get_string("sync.mode"), "' does not average gradients");
  KRAB_CHECK_ARG(!c.is_set("comm.fold_momentum") || !c.get_bool("comm.fold_momentum") ||
                     o.name == "randomk",
                 "comm.fold_momentum: true is for comm.compression 'randomk' (whose error feedback "
                 "acts as momentum), not '", o.name, "'");
  if (o.momentum > 0 && c.get_string("train.optimizer.name") == "sgd")
    KRAB_CHECK_ARG(c.get_float("train.optimizer.momentum") == 0,
                   "comm.momentum_correction ", o.momentum, " with train.optimizer.momentum ",
                   c.get_float("train.optimizer.momentum"),
                   " would apply momentum twice; set train.optimizer.momentum: 0");
  return o;
}

// randomk with error feedback sends each value after 1 / ratio steps on average: in
// expectation the accumulator a = e + g follows a <- (1 - ratio) a + g and the step sends
// ratio * a, which is heavy-ball momentum with factor 1 - ratio and learning rate ratio * lr.
// On top of sgd's own momentum m that is momentum twice (on the 2-epoch CNN, ratio 0.1 and
// m = 0.9 ended 9 points below sync). Folding runs sgd without momentum at lr / (1 - m): the
// same step per unit of gradient in the steady state (lr / (1 - m)), with error feedback as the
// only momentum. The job's config is returned unchanged when there is nothing to fold.
core::Config with_folded_momentum(const core::Config& c) {
  const double m = c.get_float("train.optimizer.momentum");
  if (c.get_string("comm.compression") != "randomk" || !c.get_bool("comm.fold_momentum") ||
      c.get_string("train.optimizer.name") != "sgd" || m == 0 || !c.get_bool("comm.error_feedback"))
    return c;
  core::Config folded = c;
  char lr[64];
  std::snprintf(lr, sizeof(lr), "%.17g", c.get_float("train.optimizer.lr") / (1 - m));
  folded.set("train.optimizer.lr", lr);
  folded.set("train.optimizer.momentum", "0");
  return folded;
}

// Local SGD's model average: every floating parameter and buffer, one all-reduce.
void average_model(torch::nn::Module& model, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> ts;
  for (auto& p : model.parameters()) ts.push_back(p);
  for (auto& b : model.buffers())
    if (b.scalar_type() == at::kFloat) ts.push_back(b);
  std::vector<at::Tensor> flat_parts;
  for (auto& t : ts) flat_parts.push_back(t.detach().reshape({-1}));
  at::Tensor flat = torch::cat(flat_parts);
  comm.allreduce(flat, comm::ReduceOp::kAvg)->wait();
  int64_t off = 0;
  for (auto& t : ts) {
    t.detach().copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

}  // namespace

void set_samples_per_sec(nlohmann::json& report, double samples_per_sec, int64_t measured_steps) {
  // A run no longer than its warm-up has no measured step: 0 would read as "infinitely slow"
  // in a table, so the report says null and why.
  if (measured_steps > 0 && samples_per_sec > 0) {
    report["samples_per_sec"] = samples_per_sec;
  } else {
    report["samples_per_sec"] = nullptr;
    report["samples_per_sec_note"] =
        "not measured: the run ended within its warm-up steps, which samples_per_sec leaves "
        "out; run more steps to measure it";
  }
}

std::string describe_samples_per_sec(const nlohmann::json& report) {
  const auto it = report.find("samples_per_sec");
  if (it == report.end() || !it->is_number()) return "samples/s not measured";
  return str_cat(static_cast<int64_t>(std::llround(it->get<double>())), " samples/s");
}

PreflightInfo preflight(const core::Config& job, int workers) {
  const core::Config c = with_folded_momentum(job);
  KRAB_CHECK_ARG(workers >= 1, "parallel.workers must be >= 1, got ", workers);
  compression_options(job);  // the job as written: its keys are what errors name
  check_async_options(c);
  auto d = load_data(c);
  const int64_t global = workers * c.get_int("data.batch_size");
  KRAB_CHECK_ARG(global <= d.train.size(), "data.batch_size ", c.get_int("data.batch_size"),
                 " x ", workers, " workers = global batch ", global,
                 " is larger than the training data (", d.train.size(), " examples)");
  auto model = models::make_model(model_spec(c, d));
  // A bad key file is bad input: refuse it now, not at the first checkpoint.
  const std::string seal_key =
      core::read_seal_key(c.get_string("checkpoint.hmac_key_file"), run_directory(c));
  if (c.get_bool("checkpoint.resume")) {
    const std::string dir = run_directory(c);
    if (auto path = latest_checkpoint(dir)) {
      auto opt = make_optimizer(c, model->parameters());
      CheckpointMeta expect{0, c.get_string("model.name"), model_signature(*model),
                            global * c.get_int("train.grad_accum"), c.get_int("train.seed")};
      decode_checkpoint(core::unseal(core::read_file(*path), seal_key, *path), *path, expect,
                        *model, *opt);
    }
  }
  PreflightInfo info;
  info.parameters = models::parameter_count(*model);
  for (const data::TensorDataset* t : {&d.train, d.test ? &*d.test : nullptr})
    if (t != nullptr)
      info.data_bytes += static_cast<int64_t>(t->inputs.nbytes() + t->targets.nbytes());
  return info;
}

nlohmann::json run_worker(const core::Config& job, const comm::WorldInfo& world,
                          const WorkerOptions& options) {
  // What runs: the job with randomk's momentum folded (see with_folded_momentum); the report
  // keeps the job as written and says what was folded.
  const core::Config c = with_folded_momentum(job);
  const auto t_start = Clock::now();
  torch::set_num_threads(static_cast<int>(c.get_int("train.threads_per_worker")));
  const int W = world.size;
  const int rank = world.rank;
  const int64_t batch = c.get_int("data.batch_size");
  const int64_t accum = c.get_int("train.grad_accum");
  const int64_t seed = c.get_int("train.seed");

  data::DataSplits d = load_data(c);
  data::GlobalBatchSampler sampler(d.train.size(), batch * W, static_cast<uint64_t>(seed));
  const int64_t steps = total_steps(c, sampler, accum);

  torch::manual_seed(static_cast<uint64_t>(seed));
  auto model = models::make_model(model_spec(c, d));

  comm::Options copts;
  copts.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(c.get_float("comm.timeout_s") * 1000));
  copts.debug_checks = c.get_bool("comm.debug_checks");
  std::unique_ptr<comm::Communicator> comm;
  try {
    comm = comm::make_communicator(c.get_string("comm.backend"), world, copts);
  } catch (const Timeout& e) {
    // The comm layer names the ranks; the user also needs the address and the knob.
    throw Timeout(str_cat(e.what(), " (rendezvous ", world.rendezvous.to_string(),
                          ", comm.timeout_s = ", c.get_float("comm.timeout_s"), " s)"));
  }
  KRAB_CHECK(comm->size() == W, "communicator size ", comm->size(), " != world ", W);

  parallel::DataParallelOptions dpo;
  dpo.bucket_mb = c.get_float("parallel.bucket_mb");
  parallel::DataParallel dp(*model, *comm, dpo,
                            compress::make_compression_hook(compression_options(c)));
  auto optimizer = make_optimizer(c, model->parameters());

  const std::string run_dir = run_directory(c);
  const CheckpointMeta expect{0, c.get_string("model.name"), model_signature(*model),
                              batch * W * accum, seed};
  const std::string seal_key = core::read_seal_key(c.get_string("checkpoint.hmac_key_file"), run_dir);
  int64_t start_step = 0;
  if (c.get_bool("checkpoint.resume")) {
    std::string path, bytes;
    if (rank == 0) {
      if (auto p = latest_checkpoint(run_dir)) {
        path = *p;
        bytes = core::unseal(core::read_file(path), seal_key, path);
      }
    }
    bytes = broadcast_bytes(*comm, bytes);
    if (!bytes.empty()) {
      start_step = decode_checkpoint(bytes, path.empty() ? "rank 0's checkpoint" : path, expect,
                                     *model, *optimizer).step;
      if (rank == 0) std::fprintf(stderr, "krab: resumed from %s at step %lld\n", path.c_str(),
                                  static_cast<long long>(start_step));
    }
  }

  const Schedule schedule = parse_schedule(c.get_string("train.lr_schedule"));
  const double base_lr = c.get_float("train.optimizer.lr");
  const int64_t warmup_lr = c.get_int("train.warmup_steps");
  const int64_t every = c.get_int("checkpoint.every_steps");
  const int keep = static_cast<int>(c.get_int("checkpoint.keep"));
  const int64_t eval_every = c.get_int("train.eval_every");
  const int64_t log_every = c.get_int("train.log_every");
  const int64_t warmup = std::min<int64_t>(10, std::max<int64_t>(1, (steps - start_step) / 10));
  const bool show = rank == 0 && options.show_progress;
  core::ProgressBar bar("train", steps);
  double last_loss = 0, smooth = -1;
  Clock::time_point t_warm = Clock::now();
  std::string last_checkpoint;

  // Periodic evaluations, for time-to-accuracy: seconds count training only (from the first
  // step, evaluation time excluded).
  nlohmann::json evals = nlohmann::json::array();
  const Clock::time_point t_loop = Clock::now();
  double eval_secs = 0;
  double eval_before_warm = 0;  // samples/s leaves out evaluations after warm-up
  const uint64_t setup_bytes = comm->traffic().total_bytes_sent();  // initial broadcast etc.

  // Synchronisation mode: local SGD skips the gradient all-reduce after its warm-up and
  // averages the models every `period` steps (and once at the end, so every rank finishes
  // with the same model).
  const bool local_sgd = c.get_string("sync.mode") == "local_sgd";
  const int64_t period = c.get_int("sync.period");
  const int64_t sync_warmup = c.get_int("sync.warmup_steps");
  const Straggler straggler(c, rank);

  model->train();
  for (int64_t step = start_step; step < steps; ++step) {
    if (step == start_step + warmup) {
      t_warm = Clock::now();
      eval_before_warm = eval_secs;
    }
    const bool local = local_sgd && step >= sync_warmup;
    double step_loss = 0;
    for (int64_t m = 0; m < accum; ++m) {
      dp.set_sync(!local && m == accum - 1);
      const auto t_compute = Clock::now();
      auto [x, y] = data::gather(d.train, sampler.indices(step * accum + m, rank, W));
      auto loss = model->loss(model->forward(x), y);
      (accum > 1 ? loss / static_cast<double>(accum) : loss).backward();
      step_loss += loss.item<double>() / accum;
      straggler.after_compute(Clock::now() - t_compute);
    }
    dp.finish();
    const double lr = learning_rate(schedule, base_lr, step, steps, warmup_lr);
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
    optimizer->step();
    optimizer->zero_grad();
    if (local && ((step + 1 - sync_warmup) % period == 0 || step + 1 == steps))
      average_model(*model, *comm);
    last_loss = step_loss;
    smooth = smooth < 0 ? step_loss : 0.95 * smooth + 0.05 * step_loss;

    const int64_t done = step + 1;
    if (every > 0 && done % every == 0 && done < steps && rank == 0)
      last_checkpoint = save_checkpoint(
          run_dir,
          core::seal(encode_checkpoint({done, expect.model_name, expect.signature,
                                        expect.global_batch, seed}, *model, *optimizer),
                     seal_key),
          done, keep);
    if (eval_every > 0 && done % eval_every == 0 && done < steps && d.test) {
      const auto t_eval = Clock::now();
      const double trained = std::chrono::duration<double>(t_eval - t_loop).count() - eval_secs;
      model->eval();
      const double acc = evaluate(*model, *d.test, *comm);
      model->train();
      eval_secs += std::chrono::duration<double>(Clock::now() - t_eval).count();
      evals.push_back({{"step", done}, {"seconds", trained}, {"test_accuracy", acc}});
      if (rank == 0) std::fprintf(stderr, "\nkrab: step %lld test accuracy %.4f\n",
                                  static_cast<long long>(done), acc);
    }
    if (show) {
      const double secs = std::chrono::duration<double>(Clock::now() - t_warm).count() -
                          (eval_secs - eval_before_warm);
      const int64_t measured = step - (start_step + warmup) + 1;
      const double rate = measured > 0 && secs > 0 ? measured * batch * W * accum / secs : 0;
      const std::string fields = str_cat("loss ", human(smooth), " | ", human(rate),
                                         " samples/s");
      bar.update(done, fields);
      if (log_every > 0 && done % log_every == 0)
        std::fprintf(stderr, "\nkrab: step %lld loss %.5f\n", static_cast<long long>(done),
                     step_loss);
    }
  }
  const auto t_end = Clock::now();
  const double train_secs =
      std::chrono::duration<double>(t_end - t_warm).count() - (eval_secs - eval_before_warm);
  const int64_t measured_steps = std::max<int64_t>(0, steps - (start_step + warmup));
  const double samples_per_sec =
      train_secs > 0 && measured_steps > 0 ? measured_steps * batch * W * accum / train_secs : 0;

  // Everything below talks to all ranks: take the traffic snapshot first, so the report
  // counts the training run only.
  const comm::TrafficStats traffic = comm->traffic();
  const double trained_secs = std::chrono::duration<double>(t_end - t_loop).count() - eval_secs;
  double accuracy = -1;
  if (d.test) {
    model->eval();
    accuracy = evaluate(*model, *d.test, *comm);
  }
  constexpr int kOps = static_cast<int>(comm::OpKind::kCount);
  auto totals = torch::zeros({3 + kOps}, torch::kFloat64);
  totals[0] = last_loss;
  totals[1] = static_cast<double>(traffic.total_bytes_sent());
  totals[2] = static_cast<double>(traffic.total_bytes_sent() - setup_bytes);
  for (int k = 0; k < kOps; ++k) totals[3 + k] = static_cast<double>(traffic.bytes_sent[k]);
  comm->allreduce(totals)->wait();

  nlohmann::json report;
  if (rank == 0) {
    if (show)
      bar.finish(str_cat("loss ", human(smooth), " | ",
                         measured_steps > 0 && samples_per_sec > 0
                             ? human(samples_per_sec) + " samples/s"
                             : std::string("samples/s not measured")));
    const std::string model_pt = (fs::path(run_dir) / "model.pt").string();
    save_model_pt(model_pt, *model);
    last_checkpoint = save_checkpoint(
        run_dir,
        core::seal(encode_checkpoint({steps, expect.model_name, expect.signature,
                                      expect.global_batch, seed}, *model, *optimizer),
                   seal_key),
        steps, keep);
    report["workers"] = W;
    report["backend"] = comm->backend();
    report["global_batch"] = batch * W * accum;
    report["steps"] = steps;
    report["start_step"] = start_step;
    report["epochs"] = static_cast<double>(steps * accum) / sampler.steps_per_epoch();
    set_samples_per_sec(report, samples_per_sec, measured_steps);
    report["wall_seconds"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    report["final_loss"] = totals[0].item<double>() / W;
    if (accuracy >= 0) {
      report["test_accuracy"] = accuracy;
      evals.push_back({{"step", steps}, {"seconds", trained_secs}, {"test_accuracy", accuracy}});
    }
    report["train_seconds"] = trained_secs;
    report["evals"] = evals;
    report["bytes_sent"] = static_cast<uint64_t>(totals[1].item<double>());
    report["bytes_sent_steps"] = static_cast<uint64_t>(totals[2].item<double>());
    nlohmann::json per_op;
    for (int k = 0; k < kOps; ++k)
      per_op[comm::op_name(static_cast<comm::OpKind>(k))] =
          static_cast<uint64_t>(totals[3 + k].item<double>());
    report["bytes_sent_by_op"] = per_op;
    report["gradient_bytes"] = static_cast<uint64_t>(models::parameter_count(*model) * 4);
    report["buckets"] = dp.plan().buckets.size();
    report["compression"] = dp.hook().name();
    report["sync_mode"] = c.get_string("sync.mode");
    report["checkpoint"] = model_pt;
    report["state"] = last_checkpoint;
    report["config"] = job.to_json();
    if (c != job)
      report["folded_momentum"] = {{"momentum", job.get_float("train.optimizer.momentum")},
                                   {"lr", c.get_float("train.optimizer.lr")}};
    if (!options.report_path.empty())
      core::write_file_atomic(options.report_path, core::dump_json(report) + "\n");
  }
  return report;
}

}  // namespace krab::train
