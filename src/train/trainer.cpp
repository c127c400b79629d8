#include "train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "comm/communicator.h"
#include "core/errors.h"
#include "core/flat.h"
#include "core/fs.h"
#include "core/seal.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "elastic/elastic_engine.h"
#include "engine/engine.h"
#include "models/describe.h"
#include "models/model.h"
#include "models/recompute.h"
#include "models/torchscript.h"
#include "monitor/snapshot_sink.h"
#include "monitor/trace_sink.h"
#include "train/adaptive_batch.h"
#include "train/batch_schedule.h"
#include "train/bottleneck.h"
#include "train/checkpoint.h"
#include "train/dry_run.h"
#include "train/engines.h"
#include "train/evaluation.h"
#include "train/manifest.h"
#include "train/memory_plan.h"
#include "train/memory_report.h"
#include "train/noise_scale.h"
#include "train/op_profile.h"
#include "train/options.h"
#include "train/peer_state.h"
#include "train/precision.h"
#include "train/schedule.h"
#include "train/sharded_checkpoint.h"
#include "train/step_phases.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A copy of the parameters to evaluate after training (EvaluationMode::kDeferred).
struct Snapshot {
  int64_t step;
  double trained_seconds;
  at::Tensor values;
};

// This rank's part of --trace's timeline (monitor/trace_sink.h). Its row is the rank the
// launcher started it as; an elastic replacement starts in a dead member's slot with that
// slot's rank, so a later incarnation takes a row of its own (rank + 1000 × incarnation)
// rather than continue the dead one's.
std::shared_ptr<core::EventSink> trace_sink(const WorkerOptions& options, int rank) {
  monitor::TraceProcess process{rank, str_cat("rank ", rank)};
  if (!options.member_id.empty()) {
    process.pid += 1000 * elastic::MemberId::parse(options.member_id).incarnation;
    process.name += str_cat(" (member ", options.member_id, ")");
  }
  return std::make_shared<monitor::TraceSink>(options.trace_path, process);
}

}  // namespace

// One rank's run: built by the constructor, driven by run(). Functions are in the order a run
// calls them.
struct Trainer::Loop {
  Loop(const core::Config& job, const comm::WorldInfo& world, const WorkerOptions& options);
  void resume();
  void attach_sinks();
  nlohmann::json run();
  void train_steps();
  bool recover(const std::string& cause);
  double compute(const engine::StepPlan& plan);
  std::pair<at::Tensor, at::Tensor> batch(int64_t sampler_step, data::BatchSlice part);
  std::pair<at::Tensor, at::Tensor> fused(int64_t first, int64_t count, data::BatchSlice part);
  void end_of_step(int64_t step, double loss, int64_t examples, bool again = false);
  bool loss_is_shared(int64_t step) const;
  double share_loss(double loss, int64_t examples);
  void maybe_checkpoint(int64_t step, bool again);
  void maybe_evaluate(int64_t step, bool again);
  void plan_batches();
  void restore_batches(const CheckpointMeta& saved, const std::string& path);
  void adapt_batch(const engine::StepPlan& plan, Clock::time_point t_step, double compute_s);
  void maybe_snapshot(const engine::StepPlan& plan);
  void report_progress(int64_t step, int64_t done);
  void count_live(int64_t samples);
  void observe_noise(const engine::StepPlan& plan);
  void write_progress_file(int64_t done);
  nlohmann::json finish_group();
  nlohmann::json gather_bottleneck();
  nlohmann::json finish_alone();
  nlohmann::json write_final_state(RunOutcome& outcome);
  std::string write_final_shards();
  CheckpointMeta meta(int64_t step) const;
  // Rank 0 of the group now: an elastic run's changes renumber the ranks.
  bool rank0() const { return group != nullptr ? group->rank() == 0 : world.rank == 0; }
  int workers() const { return group != nullptr ? group->size() : world.size; }
  // Examples per global micro-batch: fixed for the run (train.batch × the workers it started
  // with); an elastic run's changes re-split it among the workers of the day (§5.1).
  int64_t global_batch() const { return o.batch * world.size; }
  // Examples of the global micro-batches from step `from`'s first to step `to`'s first.
  int64_t examples_between(int64_t from, int64_t to) const {
    return (micro_before(to) - micro_before(from)) * global_batch();
  }
  // The global micro-batches trained before step `step` (past the last: all of them).
  int64_t micro_before(int64_t step) const {
    return std::min(schedule->first_micro(step), schedule->total_micro());
  }

  const core::Config job;  // as written: the report keeps it
  const core::Config c;    // as it runs (randomk's momentum folded, see options.h)
  const TrainOptions o;
  const comm::WorldInfo world;
  const WorkerOptions options;
  const Clock::time_point t_start = Clock::now();

  data::DataSplits d;
  std::unique_ptr<data::GlobalBatchSampler> sampler;
  // The optimizer steps of the run; with train.adaptive_batch, the most it can take (every step
  // at the smallest batch) until training ends, then the steps it took.
  int64_t steps = 0;
  std::unique_ptr<BatchSchedule> schedule;  // steps -> micro-batches (train/batch_schedule.h)
  std::unique_ptr<AdaptiveBatch> adaptive;  // train.adaptive_batch; null for a fixed batch
  double compute_seconds = 0;               // the last compute()'s
  std::unique_ptr<data::BatchPrefetcher> batches;      // data.name images: made ahead; else null
  std::unique_ptr<models::RecomputeRunner> recompute;  // model.activation_checkpointing
  std::unique_ptr<engine::Engine> engine;
  comm::Communicator* group = nullptr;  // null for engines without one

  std::string run_dir, seal_key, seal_job, model_name, signature, last_checkpoint;
  models::ScriptFile script_file;  // a TorchScript model's, recorded in checkpoints
  Metric metric = Metric::kAccuracy;
  int64_t start_step = 0;

  core::Events events;
  std::shared_ptr<ProgressSink> progress;  // rank 0 of a group, when shown
  std::shared_ptr<ReportSink> record = std::make_shared<ReportSink>();
  std::shared_ptr<PhaseSink> phases = std::make_shared<PhaseSink>();  // the bottleneck report
  std::shared_ptr<monitor::SnapshotSink> snapshot;  // for the node's endpoint (monitor_dir)
  bool engine_spans = false;              // a sink draws the engine's spans (Engine::step_spans)
  std::unique_ptr<OpProfile> op_profile;  // monitor.profile_ops, with --trace
  // A sink shows the run while it lasts: every step then counts its samples and the bytes
  // its collectives sent ("samples", "comm.bytes.<op>"; the report's own byte counts come once
  // at the end).
  bool live_metrics = false;
  comm::TrafficStats live_traffic;  // what the group had sent at the last step's count
  std::optional<NoiseScale> noise;  // the gradient noise scale, when live_metrics

  // Timing: samples/s counts the steps after `warmup` and leaves evaluations out;
  // time-to-accuracy seconds count training only, from the first step.
  int64_t warmup = 0;
  Clock::time_point t_loop, t_warm;
  double eval_secs = 0, eval_before_warm = 0;
  uint64_t setup_bytes = 0;
  double last_loss = 0;
  std::optional<double> shared_loss;   // share_loss() of the last step shared
  comm::TrafficStats loss_traffic;     // what share_loss() sent: not training traffic
  comm::TrafficStats retired_traffic;  // what the groups of earlier generations sent
  std::optional<Straggler> straggler;  // train.slow_rank's artificial delay
  int64_t computed = 0;                // steps this rank computed
  int64_t next_eval = 0;
  std::vector<Snapshot> snapshots;

  // Elastic membership (engine.h, Engine::recover): the changes for the report, and where the
  // loop stands across one.
  nlohmann::json membership = nlohmann::json::array();
  int64_t ended = 0;             // steps whose end_of_step() ran
  int64_t committed = 0;         // steps committed when the last change was recovered
  double step_loss = 0;          // the last step computed: its loss and examples, for an
  int64_t step_examples = 0;     // end_of_step() a change cut short
  double ended_loss = 0;         // the same of the last step whose end_of_step() ran, for
  int64_t ended_examples = 0;    // taking part in it again (a joiner has none)
  bool awaiting_resume = false;  // a change was recovered; its first step has not completed
};

Trainer::Loop::Loop(const core::Config& job_in, const comm::WorldInfo& world_in,
                    const WorkerOptions& options_in)
    : job(job_in),
      c(with_folded_momentum(job_in)),
      o(TrainOptions::from_config(c)),
      world(world_in),
      options(options_in) {
  torch::set_num_threads(o.threads);
  straggler.emplace(c, world.rank);
  d = load_data(c, DataResidency::kLazy, world.rank == 0 ? LoadNotes::kSay : LoadNotes::kQuiet);
  sampler = std::make_unique<data::GlobalBatchSampler>(
      d.training().size(), global_batch(), static_cast<uint64_t>(o.seed), d.training().layout());
  plan_batches();
  batches = image_batches(c, d, *sampler, schedule->total_micro());
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  engine = make_engine(c, o, world, model_spec(c, d), steps,
                       {options.member_id, options.joining, options.etcd_endpoints,
                        options.etcd_run});  // builds the model
  model_name = c.get_string("model.name");
  signature = model_signature(engine->model());
  if (const auto* ts = models::as_torchscript(engine->model()))
    script_file = ts->file();  // for export
  metric = resolve_metric(c, engine->model(), d);
  group = engine->group();
  run_dir = run_directory(c);
  seal_key = core::read_seal_key(c.get_string("checkpoint.hmac_key_file"), run_dir);
  seal_job = checkpoint_job(run_dir, signature);
  attach_sinks();
  // model.activation_checkpointing. A model has one runner: an engine that installed its own
  // (ZeRO's) must recompute inside it (models::run_recomputed) when this key is set.
  models::Model& net = engine->model();
  if (o.activation_checkpointing && net.unit_runner() == nullptr) {
    if (!net.unit_candidates().empty()) {
      recompute = std::make_unique<models::RecomputeRunner>(net);
      recompute->install(net);
    } else if (rank0()) {
      std::fprintf(stderr,
                   "krab: warning: model.activation_checkpointing: model '%s' has no units to "
                   "recompute; it trains with all its activations kept\n",
                   model_name.c_str());
    }
  }
  if (options.joining)  // it entered a running job at the step it received (no resume)
    start_step = dynamic_cast<elastic::ElasticEngine&>(*engine).applied_steps();
  else if (o.resume && group != nullptr)
    resume();
  engine->start_at(start_step);
}

// The run's length and how its steps take the sampler's micro-batches: train.grad_accum of them
// a step, or train.adaptive_batch's schedule (its length in steps of the smallest batch).
void Trainer::Loop::plan_batches() {
  const auto adapt = AdaptiveBatchOptions::from_config(c, world.size, d.training().size());
  if (!adapt) {
    steps = total_steps(c, *sampler, o.micro_batches);
    schedule = std::make_unique<BatchSchedule>(o.micro_batches, steps * o.micro_batches);
    return;
  }
  const int64_t unit = adapt->min_micro;
  const int64_t total = c.get_int("train.steps") > 0
                            ? c.get_int("train.steps") * unit
                            : c.get_int("train.epochs") * sampler->steps_per_epoch();
  steps = (total + unit - 1) / unit;
  schedule = std::make_unique<BatchSchedule>(unit, total);
  adaptive = std::make_unique<AdaptiveBatch>(*adapt, *schedule);
}

CheckpointMeta Trainer::Loop::meta(int64_t step) const {
  CheckpointMeta m{step, model_name, signature, global_batch() * o.micro_batches, o.seed};
  m.model_file = script_file.path;
  m.model_sha256 = script_file.sha256;
  if (adaptive) m.adaptive_batch = adaptive->save();
  return m;
}

void Trainer::Loop::resume() {
  // Rank 0 picks the checkpoint: "" for none, else 'S' (a manifest: sharded) or 'F'
  // (state.krab) and its step directory, so that every rank takes the same path.
  std::string pick;
  if (rank0())
    if (auto dir = latest_step_dir(run_dir))
      pick = (core::path_exists(manifest_path(*dir)) ? "S" : "F") + *dir;
  pick = broadcast_bytes(*group, pick);
  if (pick.empty()) return;
  const engine::TrainState state = engine->state();
  const std::string dir = pick.substr(1);
  std::string path = (fs::path(dir) / "state.krab").string();
  if (state.sharded == nullptr && pick[0] == 'F') {
    // A full replica from state.krab: rank 0 reads, the bytes reach the others (no shared file
    // system needed).
    std::string bytes;
    if (rank0()) bytes = read_checkpoint_file(path, seal_key, seal_job);
    bytes = broadcast_bytes(*group, bytes);
    const CheckpointMeta saved = decode_checkpoint(bytes, rank0() ? path : "rank 0's checkpoint",
                                                   meta(0), *state.model, *state.optimizer);
    start_step = saved.step;
    restore_batches(saved, path);
  } else {
    // Every other pairing reads per parameter name (train/checkpoint_reader.h); every rank
    // needs the files its ranges touch.
    if (pick[0] == 'S') path = manifest_path(dir);
    const CheckpointMeta saved =
        restore_checkpoint(group, dir, {seal_key, seal_job}, meta(0), state);
    start_step = saved.step;
    restore_batches(saved, path);
  }
  engine->after_restore();
  events.note(str_cat("resumed from ", path, " at step ", start_step));
}

// A checkpoint's adaptive batch state into this run's; refused when one of the two runs adapts
// its batch and the other does not (their steps would not be the same examples).
void Trainer::Loop::restore_batches(const CheckpointMeta& saved, const std::string& path) {
  KRAB_CHECK_ARG(saved.adaptive_batch.empty() == (adaptive == nullptr), "checkpoint '", path,
                 "' was written by a run ", adaptive ? "without" : "with",
                 " train.adaptive_batch; this job has it ", adaptive ? "on" : "off",
                 " (it must match to resume)");
  if (adaptive) adaptive->restore(saved.adaptive_batch, path);
}

void Trainer::Loop::attach_sinks() {
  events.add(record);
  events.add(phases);
  if (!options.trace_path.empty()) {
    events.add(trace_sink(options, world.rank));
    engine_spans = true;
    if (c.get_bool("monitor.profile_ops")) op_profile = std::make_unique<OpProfile>();
  }
  // Workers without a group have no view of the job's progress: their server draws it.
  if (rank0() && group != nullptr && options.show_progress) {
    progress = std::make_shared<ProgressSink>("train", schedule->total_units(),
                                              loss_and_rate_fields(), o.log_every);
    events.add(progress);
  } else if (rank0()) {
    events.add(std::make_shared<core::NoteSink>());
  }
  // The launcher serves this rank's numbers while it trains (monitor/endpoint.h): they must
  // then move at every step, not only at the end.
  if (!options.monitor_dir.empty()) {
    snapshot = std::make_shared<monitor::SnapshotSink>(
        options.monitor_dir, monitor::SnapshotSink::Identity{
                                 group != nullptr ? group->rank() : world.rank, options.member_id});
    events.add(snapshot);
    live_metrics = true;
  }
  // Shown runs also estimate the gradient noise scale (train/noise_scale.h): two more passes
  // over the gradients a step, for a number that says how large a batch still pays.
  if (live_metrics && workers() > 1) {
    engine->measure_gradient_norms(true);
    noise.emplace();
  }
  if (adaptive) {
    engine->measure_gradient_norms(true);
    events.gauge("global_batch", static_cast<double>(global_batch() * schedule->unit()), 0);
  }
}

nlohmann::json Trainer::Loop::run() {
  warmup = measurement_warmup(steps - start_step);
  t_loop = t_warm = Clock::now();
  if (group != nullptr) setup_bytes = group->traffic().total_bytes_sent();
  next_eval = o.eval_every > 0 ? (start_step / o.eval_every + 1) * o.eval_every : 0;
  engine->model().train();
  ended = committed = start_step;
  // An elastic engine's group can break in any step (a worker died): the engine recovers on
  // the next generation's group and the loop goes on from the first step not committed.
  for (;;) {
    std::string cause;
    try {
      train_steps();
      if (adaptive) steps = ended;  // the steps it took
      break;
    } catch (const PeerLost& e) {
      if (!engine->can_recover()) throw;
      cause = e.what();
    } catch (const Timeout& e) {
      if (!engine->can_recover()) throw;
      cause = e.what();
    }
    if (!recover(cause)) {  // this worker left the run (SIGTERM): the others go on without it
      events.note(str_cat("left the run after step ", committed));
      return nlohmann::json();
    }
  }
  nlohmann::json report = group != nullptr ? finish_group() : finish_alone();
  // The endpoint serves the run's last numbers too; a snapshot that cannot be written (its
  // directory gone with a launcher that died) must not fail a run whose outputs are written.
  try {
    if (snapshot) snapshot->flush();
  } catch (const Error& e) {
    std::fprintf(stderr, "krab: warning: rank %d: %s\n", world.rank, e.what());
  }
  return report;
}

void Trainer::Loop::train_steps() {
  // A step committed whose end_of_step() a change cut short on some member (its shared loss,
  // checkpoint or evaluation) ends now, on the new group: every member runs its collectives
  // again, the ones that had ended it without recording anything twice (a joiner takes part
  // with no examples).
  if (const int64_t unended = engine->unended_step(); unended >= 0) {
    if (ended > unended)
      end_of_step(unended, ended_loss, ended_examples, /*again=*/true);
    else
      end_of_step(unended, step_loss, step_examples);
    ended = std::max(ended, unended + 1);
  }
  while (const auto plan = engine->next_step()) {
    // An adaptive batch that grew reaches the end of the data in fewer steps than the engine
    // was given (every rank stops at the same step: the schedule is the same everywhere).
    if (adaptive && schedule->past_end(plan->step)) break;
    maybe_snapshot(*plan);
    if (plan->step == start_step + warmup) {
      t_warm = Clock::now();
      eval_before_warm = eval_secs;
      phases->reset();
    }
    auto step_span = events.time(phase::kStep);
    const Clock::time_point t_step = Clock::now();
    const double loss = compute(*plan);
    step_loss = loss;  // kept for the step's end, which a failure in apply() may postpone
    step_examples = plan->slice.size();
    {
      auto span = events.time(phase::kReduce);
      engine->reduce_gradients();
    }
    if (engine_spans)
      for (const engine::PhaseSpan& s : engine->step_spans())
        events.span(s.name, s.start, s.seconds);
    if (noise || adaptive) observe_noise(*plan);
    {
      auto span = events.time(phase::kOptimizer);
      // The schedule counts steps of the smallest batch; an adaptive batch's rate follows it.
      const double lr = learning_rate(o.schedule, o.base_lr, schedule->units_before(plan->step),
                                      schedule->total_units(), o.lr_warmup_steps);
      engine->apply(adaptive ? lr * adaptive->lr_gain(plan->step) : lr);
    }
    {
      auto span = events.time(phase::kAfter);
      engine->after_step(*plan);
      if (adaptive) adapt_batch(*plan, t_step, compute_seconds);
    }
    ++computed;
    {
      auto span = events.time(phase::kEnd);
      end_of_step(plan->step, loss, plan->slice.size());
    }
    step_span.stop();
    if (op_profile) op_profile->drain(events);
    if (live_metrics) count_live(plan->slice.size() * o.micro_batches);
    ended = plan->step + 1;
    if (awaiting_resume) {  // the first step of the new generation is complete
      awaiting_resume = false;
      nlohmann::json& change = membership.back();
      change["resumed_at"] = unix_seconds_now();
      change["recovery_seconds"] =
          change["resumed_at"].get<double>() - change["decided_at"].get<double>();
    }
  }
}

// The engine is on the next generation's group when recover() returns; what it says goes to
// the report's `membership` and, on rank 0, to the terminal. False when this worker is not in
// the next generation because it asked to leave.
bool Trainer::Loop::recover(const std::string& cause) {
  const comm::TrafficStats sent = group->traffic();  // the old group leaves with recover()
  for (size_t k = 0; k < sent.bytes_sent.size(); ++k) {
    retired_traffic.bytes_sent[k] += sent.bytes_sent[k];
    retired_traffic.ops[k] += sent.ops[k];
  }
  nlohmann::json change;
  auto span = events.time(phase::kMembership);
  try {
    change = engine->recover(cause, ended);
  } catch (const elastic::RunStopped& e) {
    // Too few workers were left for too long: the run ends resumable (§2.5). A survivor holds
    // a full replica of the steps it applied (at most one behind the others': that step is
    // computed again on resume).
    const engine::TrainState state = engine->state();
    if (e.writer() && state.sharded == nullptr)
      last_checkpoint = save_checkpoint(run_dir, meta(e.step()), *state.model, *state.optimizer,
                                        seal_key, seal_job, o.checkpoint_keep);
    else if (e.writer())  // a sharded checkpoint is written by every rank of a live group
      std::fprintf(stderr,
                   "krab: parallel.zero_stage %d: no checkpoint of step %lld is written (each "
                   "worker holds one shard and the group is gone); resume from the last "
                   "checkpoint.every_steps checkpoint\n",
                   o.zero_stage, static_cast<long long>(e.step()));
    throw;
  }
  if (change.value("left", false)) {
    committed = change["step"].get<int64_t>();
    return false;
  }
  group = engine->group();
  live_traffic = group->traffic();  // the live byte counters go on from the new group's
  if (snapshot) snapshot->set_rank(group->rank());
  committed = change["step"].get<int64_t>();
  awaiting_resume = true;
  // The process that is rank 0 now draws the bar (rank 0 of the start may be the one lost).
  if (rank0() && !progress && options.show_progress) {
    progress = std::make_shared<ProgressSink>("train", schedule->total_units(),
                                              loss_and_rate_fields(), o.log_every);
    events.add(progress);
  }
  events.gauge("workers", workers(), committed);
  events.gauge("generation", change["generation"].get<double>(), committed);
  std::string who = change["lost"].get<std::string>();
  if (!change["joined"].get<std::string>().empty())
    who += str_cat(who.empty() ? "" : "; ", "joined: member ", change["joined"].get<std::string>());
  if (rank0())
    std::fprintf(stderr,
                 "krab: generation %lld: %s (%s); %d workers go on from step %lld, %lld step(s) "
                 "lost\n",
                 static_cast<long long>(change["generation"].get<int64_t>()),
                 change["reason"].get<std::string>().c_str(), who.c_str(), workers(),
                 static_cast<long long>(committed),
                 static_cast<long long>(change["lost_steps"].get<int64_t>()));
  membership.push_back(std::move(change));
  return true;
}

// Forward and backward of the step's micro-batches on this rank's slice; the mean loss.
// train.grad_accum's micro-batches are one forward and backward each (the point is the memory
// of one); an adaptive batch's are one forward of them all (the launcher checked that memory
// holds the largest, cli/main.cpp), the per-worker batch a larger step is meant to have. The
// loss is the mean over the step's examples either way.
double Trainer::Loop::compute(const engine::StepPlan& plan) {
  models::Model& model = engine->model();
  const int64_t micro = schedule->micro_batches(plan.step);
  const int64_t first = schedule->first_micro(plan.step);
  const int64_t accum = adaptive ? 1 : micro;  // forward passes
  double step_loss = 0;
  compute_seconds = 0;
  Clock::time_point t_backward;  // backward and train.slow_rank's delay: one span
  for (int64_t m = 0; m < accum; ++m) {
    engine->before_backward(m, m == accum - 1);
    const auto t_compute = Clock::now();
    auto data_span = events.time(phase::kData);
    const auto xy = accum == micro ? batch(first + m, plan.slice) : fused(first, micro, plan.slice);
    data_span.stop();
    // A run's first step turns LibTorch's error into one naming train.precision when bf16
    // autocast cannot run this model (precision.h). Only the forward and the loss are autocast.
    explain_precision_failure(computed == 0 ? o.precision : Precision::kFp32, [&] {
      at::Tensor loss;
      auto forward_span = events.time(phase::kForward);
      {
        AutocastGuard autocast(o.precision);
        loss = model.training_loss(xy.first, xy.second);
      }
      const double value = loss.item<double>();
      forward_span.stop();
      // A NaN or an infinity would reach every replica through the all-reduce and leave a
      // model of NaNs: stop here, where the step and the rank are known.
      if (!std::isfinite(value))
        throw Error(str_cat("rank ", world.rank, ": the loss is ", value, " at step ",
                            plan.step + 1, " (micro-batch ", m,
                            "); training diverged or the "
                            "data holds a NaN (try a smaller train.optimizer.lr)"));
      // plan.weight (engine.h): unequal slices weigh their share of the global mean gradient;
      // exactly 1 for equal slices, which then multiply nothing (bit-identical to no weight).
      if (plan.weight != 1.0)
        loss = loss * (plan.weight / static_cast<double>(accum));
      else if (accum > 1)
        loss = loss / static_cast<double>(accum);
      t_backward = Clock::now();
      loss.backward();
      step_loss += value / accum;
    });
    straggler->after_compute(Clock::now() - t_compute);
    events.span(phase::kBackward, t_backward, seconds_between(t_backward, Clock::now()));
    compute_seconds += seconds_between(t_compute, Clock::now());
  }
  engine->after_compute(compute_seconds);
  return step_loss;
}

std::pair<at::Tensor, at::Tensor> Trainer::Loop::batch(int64_t sampler_step,
                                                       data::BatchSlice part) {
  if (batches) return batches->get(sampler_step, part);
  return data::gather(d.training(), sampler->slice(sampler_step, part));
}

// This rank's part of micro-batches first..first+count-1, as one batch.
std::pair<at::Tensor, at::Tensor> Trainer::Loop::fused(int64_t first, int64_t count,
                                                       data::BatchSlice part) {
  std::vector<at::Tensor> xs, ys;
  for (int64_t m = 0; m < count; ++m) {
    auto xy = batch(first + m, part);
    xs.push_back(std::move(xy.first));
    ys.push_back(std::move(xy.second));
  }
  return {torch::cat(xs), torch::cat(ys)};
}

// `again`: this rank ran this step's end before a change cut it short elsewhere; it takes part
// in the collectives (the loss it adds is its slice's of that step) and records nothing.
void Trainer::Loop::end_of_step(int64_t step, double loss, int64_t examples, bool again) {
  const int64_t done = schedule->units_after(step);  // steps for a fixed batch
  // Without a group (a parameter-server worker) this rank's loss is all there is, and nobody
  // draws it: its server shows the job's progress.
  if (group == nullptr) {
    events.gauge("loss", loss, done);
  } else if (loss_is_shared(step)) {
    const double shared = share_loss(loss, examples);
    if (!again) {
      shared_loss = shared;
      events.gauge("loss", shared, done);
    }
  }
  maybe_checkpoint(step, again);
  maybe_evaluate(step, again);
  if (again) return;
  last_loss = ended_loss = loss;
  ended_examples = examples;
  if (progress) report_progress(step, done);
  if (!options.progress_file.empty() && rank0()) write_progress_file(done);
}

// This rank's gradient (of its slice) against the group's average (of the global batch), once
// the step's reduction is done. A weighted slice's gradient (parallel.balance) is its mean
// gradient times plan.weight: divided out here.
void Trainer::Loop::observe_noise(const engine::StepPlan& plan) {
  const auto norms = engine->gradient_norms();
  const int64_t accum = schedule->micro_batches(plan.step);
  const int64_t small = plan.slice.size() * accum;
  const int64_t big = global_batch() * accum;
  if (!norms || small <= 0 || big <= small) return;
  const double own = norms->first / (plan.weight * plan.weight);
  if (adaptive) adaptive->observe_gradients(own, small, norms->second, big);
  if (!noise) return;
  noise->add(own, small, norms->second, big);
  if (const auto b = noise->b_simple())
    events.gauge("gradient_noise_scale", *b, schedule->units_after(plan.step));
}

// train.adaptive_batch, after a step's update: its timing, then (every few steps, on every
// rank) the choice of the batch for the steps to come.
void Trainer::Loop::adapt_batch(const engine::StepPlan& plan, Clock::time_point t_step,
                                double compute_s) {
  adaptive->observe_time(plan.step, start_step, compute_s, seconds_between(t_step, Clock::now()),
                         schedule->micro_batches(plan.step));
  const int64_t before = schedule->segments().size();
  adaptive->maybe_decide(plan.step, *group);
  if (static_cast<int64_t>(schedule->segments().size()) != before) {
    const int64_t batch = schedule->segments().back().micro_batches * global_batch();
    events.gauge("global_batch", static_cast<double>(batch), schedule->units_after(plan.step));
    events.note(str_cat("step ", plan.step + 1, ": global batch ", batch));
  }
}

void Trainer::Loop::count_live(int64_t samples) {
  events.counter("samples", static_cast<double>(samples));
  if (group == nullptr) return;
  const comm::TrafficStats now = group->traffic();
  for (size_t k = 0; k < now.bytes_sent.size(); ++k) {
    // A new generation's group counts from 0 again.
    const uint64_t before =
        now.bytes_sent[k] >= live_traffic.bytes_sent[k] ? live_traffic.bytes_sent[k] : 0;
    if (now.bytes_sent[k] > before)
      events.counter(str_cat("comm.bytes.", comm::op_name(static_cast<comm::OpKind>(k))),
                     static_cast<double>(now.bytes_sent[k] - before));
  }
  live_traffic = now;
}

void Trainer::Loop::write_progress_file(int64_t done) {
  core::write_file_atomic(options.progress_file, str_cat(done, "\n"), core::FileAccess::kShared);
}

// "The loss" of a step, wherever krab shows it (progress bar, step lines, summary, report's
// final_loss), is one number: the mean training loss over the whole global batch, every
// worker's slice and every micro-batch (the mean of the per-example losses, so slices that
// differ by one example weigh what they hold). Rank 0 alone knows only its slice, so the
// group sums it, at the steps someone reads it: every train.log_every, every twentieth of the
// run (the bar), and the last one. At most ~20 + steps / log_every all-reduces of 16 bytes.
bool Trainer::Loop::loss_is_shared(int64_t step) const {
  const int64_t stride = std::max<int64_t>(1, schedule->total_units() / 20);
  return schedule->last(step) || (o.log_every > 0 && schedule->crosses(step, o.log_every)) ||
         schedule->crosses(step, stride);
}

double Trainer::Loop::share_loss(double loss, int64_t examples) {
  auto span = events.time(phase::kLoss);
  const comm::TrafficStats before = group->traffic();
  const double n = static_cast<double>(examples);
  auto sums = torch::tensor({loss * n, n}, torch::kFloat64);
  group->allreduce(sums)->wait();
  // The report's traffic meter counts training: leave these bytes out of it.
  const comm::TrafficStats after = group->traffic();
  for (size_t k = 0; k < after.bytes_sent.size(); ++k)
    loss_traffic.bytes_sent[k] += after.bytes_sent[k] - before.bytes_sent[k];
  return sums[0].item<double>() / sums[1].item<double>();
}

// `again` (end_of_step): a sharded checkpoint is written again by the new group (its old
// group may not have finished it); rank 0's whole one is on disk already when rank 0 ran it.
void Trainer::Loop::maybe_checkpoint(int64_t step, bool again) {
  if (o.checkpoint_every <= 0 || !schedule->crosses(step, o.checkpoint_every) ||
      schedule->last(step))
    return;
  const int64_t done = step + 1;  // a checkpoint's step counts optimizer steps
  auto span = events.time(phase::kCheckpoint);
  engine->settle();  // collective: every rank, before rank 0 reads the parameters
  const engine::TrainState state = engine->state();
  if (state.sharded != nullptr) {  // every rank writes its shard
    last_checkpoint = save_sharded_checkpoint(*group, run_dir, meta(done), state,
                                              {seal_key, seal_job}, o.checkpoint_keep);
    return;
  }
  if (!rank0() || again) return;
  last_checkpoint = save_checkpoint(run_dir, meta(done), *state.model, *state.optimizer, seal_key,
                                    seal_job, o.checkpoint_keep);
}

// EvaluationMode::kCollective: every train.eval_every steps, on the group, timed apart.
void Trainer::Loop::maybe_evaluate(int64_t step, bool again) {
  if (group == nullptr || o.eval_every <= 0 || !schedule->crosses(step, o.eval_every) ||
      schedule->last(step) || d.testing() == nullptr)
    return;
  const int64_t done = schedule->units_after(step);
  auto span = events.time(phase::kEvaluation);
  const auto t_eval = Clock::now();
  const double trained = seconds_between(t_loop, t_eval) - eval_secs;
  engine->settle();
  models::Model& model = engine->model();
  model.eval();
  const double value = evaluate(model, metric, *d.testing(), o.eval_examples, *group);
  model.train();
  eval_secs += seconds_between(t_eval, Clock::now());
  if (again) return;
  events.gauge("train_seconds", trained, done);
  events.gauge(metric_key(metric), value, done);
  events.note(str_cat("step ", done, " ", describe_test_metric(metric_name(metric), value)));
}

// EvaluationMode::kDeferred: when the job's progress (the step about to be computed) passes a
// multiple of train.eval_every, rank 0 keeps a copy of the parameters it is about to use and
// evaluates the copies after training. Memory: one parameter copy per evaluation. (Engines
// that evaluate this way have no group, so nothing they hold is ever in flight: no settle().)
void Trainer::Loop::maybe_snapshot(const engine::StepPlan& plan) {
  if (engine->evaluation_mode() != engine::EvaluationMode::kDeferred || !rank0() ||
      o.eval_every <= 0 || d.testing() == nullptr || plan.step < next_eval || computed == 0)
    return;
  next_eval = (plan.step / o.eval_every + 1) * o.eval_every;
  snapshots.push_back({plan.step, seconds_between(t_loop, Clock::now()),
                       core::flatten(engine->model().parameters())});
}

void Trainer::Loop::report_progress(int64_t step, int64_t done) {
  const double secs = seconds_between(t_warm, Clock::now()) - (eval_secs - eval_before_warm);
  const int64_t measured = step - (start_step + warmup) + 1;
  const double rate =
      measured > 0 && secs > 0
          ? static_cast<double>(examples_between(start_step + warmup, step + 1)) / secs
          : 0;
  events.gauge("samples_per_sec", rate, done);
  events.step(done, schedule->total_units());
}

nlohmann::json Trainer::Loop::finish_group() {
  const auto t_end = Clock::now();
  const double train_secs = seconds_between(t_warm, t_end) - (eval_secs - eval_before_warm);
  RunOutcome out;
  out.measured_steps = std::max<int64_t>(0, steps - (start_step + warmup));
  out.samples_per_sec =
      train_secs > 0 && out.measured_steps > 0
          ? static_cast<double>(examples_between(start_step + warmup, steps)) / train_secs
          : 0;
  // Everything below talks to all ranks: take the traffic snapshot first, so the report
  // counts the training run only.
  comm::TrafficStats traffic = group->traffic();
  for (size_t k = 0; k < traffic.bytes_sent.size(); ++k)
    traffic.bytes_sent[k] += retired_traffic.bytes_sent[k] - loss_traffic.bytes_sent[k];
  out.train_seconds = seconds_between(t_loop, t_end) - eval_secs;
  engine->settle();  // every rank: evaluation and the final state read the parameters
  models::Model& model = engine->model();
  if (d.testing() != nullptr) {
    model.eval();
    const double value = evaluate(model, metric, *d.testing(), o.eval_examples, *group);
    if (o.eval_examples > 0)
      out.eval_examples = evaluation_size(d.testing()->size(), o.eval_examples);
    if (metric == Metric::kLoss)
      out.test_loss = value;
    else
      out.test_accuracy = value;
  }
  constexpr int kOps = static_cast<int>(comm::OpKind::kCount);
  auto totals = torch::zeros({5 + kOps}, torch::kFloat64);
  totals[0] = last_loss;
  totals[1] = static_cast<double>(traffic.total_bytes_sent());
  totals[2] = static_cast<double>(traffic.total_bytes_sent() - setup_bytes);
  for (int k = 0; k < kOps; ++k) totals[3 + k] = static_cast<double>(traffic.bytes_sent[k]);
  // The training thread's wait for prefetched batches, against the loop's training time.
  totals[3 + kOps] = batches ? batches->waited_seconds() : 0.0;
  totals[4 + kOps] = out.train_seconds;
  group->allreduce(totals)->wait();
  const at::Tensor memory = gather_rank_memory(*engine, *group);  // report's `memory`
  out.bottleneck = gather_bottleneck();
  if (noise && noise->b_simple())
    out.gradient_noise_scale = {{"b_simple", *noise->b_simple()},
                                {"gradient_sq", noise->gradient_sq()},
                                {"trace_sigma", noise->trace_sigma()},
                                {"steps", noise->steps()}};
  if (batches) {
    events.counter("data_wait_seconds", totals[3 + kOps].item<double>());
    events.counter("data_wait_train_seconds", totals[4 + kOps].item<double>());
  }
  events.counter("bytes_sent", totals[1].item<double>());
  events.counter("bytes_sent_steps", totals[2].item<double>());
  for (int k = 0; k < kOps; ++k)
    events.counter(str_cat("bytes_sent.", comm::op_name(static_cast<comm::OpKind>(k))),
                   totals[3 + k].item<double>());
  const std::string final_state = write_final_shards();
  // Every rank: an engine that frees its parameters (ZeRO stage 3) gathers them for model.pt.
  save_model_pt((fs::path(run_dir) / "model.pt").string(), *engine, rank0());
  if (!rank0()) return nlohmann::json();
  // The last step's shared loss; the mean of the ranks' last losses when this run computed no
  // step (resumed at its end).
  out.final_loss = shared_loss ? *shared_loss : totals[0].item<double>() / workers();
  out.memory = memory_report(
      c, model, memory,
      models::activation_bytes(model_spec(c, d), o.batch,
                               bool_key_or(c, "model.activation_checkpointing", false)),
      evaluation_activation_bytes(
          model_spec(c, d), d.testing() ? evaluation_size(d.testing()->size(), o.eval_examples) : 0,
          workers()),
      d.training().resident_bytes() + (d.testing() ? d.testing()->resident_bytes() : 0));
  if (progress) {
    events.gauge("samples_per_sec", out.samples_per_sec, steps);
    progress->finish();
  }
  out.state = final_state;
  return write_final_state(out);
}

// Every rank's step phases (PhaseSink, since the warm-up), one row per rank; rank 0 makes the
// report's `bottleneck` of them (train/bottleneck.h). Collective; null on other ranks.
nlohmann::json Trainer::Loop::gather_bottleneck() {
  constexpr int kPhases = PhaseTotals::kCount;
  auto rows = torch::zeros({workers(), kPhases + 1}, torch::kFloat64);
  const PhaseTotals& own = phases->totals();
  auto row = rows.accessor<double, 2>()[group->rank()];
  for (int k = 0; k < kPhases; ++k) row[k] = own.seconds[k];
  row[kPhases] = static_cast<double>(own.steps);
  group->allreduce(rows)->wait();
  if (!rank0()) return nullptr;
  std::vector<PhaseTotals> ranks(static_cast<size_t>(workers()));
  auto all = rows.accessor<double, 2>();
  for (int r = 0; r < workers(); ++r) {
    for (int k = 0; k < kPhases; ++k) ranks[r].seconds[k] = all[r][k];
    ranks[r].steps = static_cast<int64_t>(all[r][kPhases]);
  }
  RunShape shape;
  shape.workers = workers();
  shape.compression = c.get_string("comm.compression");
  shape.sync_mode = c.get_string("sync.mode");
  shape.balance = c.get_string("parallel.balance");
  shape.zero_stage = o.zero_stage;
  shape.decodes_images = c.get_string("data.name") == "images";
  shape.decode_threads = static_cast<int>(c.get_int("data.decode_threads"));
  return bottleneck_report(ranks, shape);
}

// A sharded engine's final checkpoint, on every rank (collective); its manifest's path on rank
// 0, "" elsewhere and for a full replica (write_final_state writes state.krab then).
std::string Trainer::Loop::write_final_shards() {
  const engine::TrainState state = engine->state();
  if (state.sharded == nullptr) return "";
  return save_sharded_checkpoint(*group, run_dir, meta(steps), state, {seal_key, seal_job},
                                 o.checkpoint_keep);
}

// Rank 0 of a group: model.pt, the final checkpoint (unless write_final_shards() wrote it),
// the report.
nlohmann::json Trainer::Loop::write_final_state(RunOutcome& out) {
  const engine::TrainState state = engine->state();
  out.checkpoint = (fs::path(run_dir) / "model.pt").string();  // finish_group wrote it
  if (state.sharded == nullptr)
    out.state = save_checkpoint(run_dir, meta(steps), *state.model, *state.optimizer, seal_key,
                                seal_job, o.checkpoint_keep);
  out.workers = workers();
  out.global_batch = global_batch() * schedule->unit();  // an adaptive batch's smallest
  out.steps = steps;
  out.start_step = start_step;
  out.epochs = static_cast<double>(micro_before(steps)) / sampler->steps_per_epoch();
  out.wall_seconds = seconds_between(t_start, Clock::now());
  out.evals = record->evals();
  out.bytes_sent = static_cast<uint64_t>(record->total("bytes_sent"));
  out.bytes_sent_steps = static_cast<uint64_t>(record->total("bytes_sent_steps"));
  for (int k = 0; k < static_cast<int>(comm::OpKind::kCount); ++k) {
    const char* op = comm::op_name(static_cast<comm::OpKind>(k));
    out.bytes_sent_by_op[op] = static_cast<uint64_t>(record->total(str_cat("bytes_sent.", op)));
  }
  out.gradient_bytes = static_cast<uint64_t>(models::parameter_count(*state.model) * 4);
  out.sync_mode = sync_mode_name(o.sync_mode);
  nlohmann::json report = make_report(out, engine->describe(), job.to_json());
  if (batches) {
    const double train = record->total("data_wait_train_seconds");
    report["data_wait_fraction"] = train > 0 ? record->total("data_wait_seconds") / train : 0.0;
  }
  if (!membership.empty()) report["membership"] = membership;
  if (adaptive) report["adaptive_batch"] = adaptive->describe();
  if (c != job)
    report["folded_momentum"] = {{"momentum", job.get_float("train.optimizer.momentum")},
                                 {"lr", c.get_float("train.optimizer.lr")}};
  if (!options.report_path.empty())
    core::write_file_atomic(options.report_path, core::dump_json(report) + "\n",
                            core::FileAccess::kShared);
  return report;
}

// A worker without a group (parameter-server worker): evaluates its snapshots, hands its
// summary to the engine (which reports it to the servers) and returns the engine's view.
nlohmann::json Trainer::Loop::finish_alone() {
  engine::RunSummary summary;
  summary.steps = computed;
  summary.seconds = seconds_between(t_loop, Clock::now());
  summary.final_loss = last_loss;
  if (!snapshots.empty()) {
    models::Model& model = engine->model();
    model.eval();
    const std::vector<at::Tensor> params = model.parameters();
    for (const Snapshot& snap : snapshots) {
      engine->keep_alive();  // one evaluation must take less than sync.worker_timeout_s
      core::unflatten_into(snap.values, params);
      const double value = evaluate_alone(model, metric, *d.testing(), o.eval_examples);
      engine::Evaluation e{snap.step, snap.trained_seconds};
      (metric == Metric::kLoss ? e.test_loss : e.test_accuracy) = value;
      summary.evals.push_back(e);
      char line[64];
      std::snprintf(line, sizeof(line),
                    "step %lld (%.1f s of training): ", static_cast<long long>(snap.step),
                    snap.trained_seconds);
      events.note(line + describe_test_metric(metric_name(metric), value));
    }
  }
  engine->finish(summary);
  return engine->describe();
}

Trainer::Trainer(const core::Config& job, const comm::WorldInfo& world,
                 const WorkerOptions& options)
    : loop_(std::make_unique<Loop>(job, world, options)) {}

Trainer::~Trainer() = default;

nlohmann::json Trainer::run() { return loop_->run(); }

nlohmann::json run_worker(const core::Config& config, const comm::WorldInfo& world,
                          const WorkerOptions& options) {
  return Trainer(config, world, options).run();
}

nlohmann::json run_async_worker(const core::Config& config, const comm::WorldInfo& world,
                                const WorkerOptions& options) {
  return Trainer(config, world, options).run();
}

}  // namespace krab::train
