#include "sync/shard.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/errors.h"

namespace krab::sync {

ShardRange shard_range(int64_t total, int shard, int servers) {
  KRAB_CHECK(servers >= 1 && shard >= 0 && shard < servers, "shard ", shard, " of ", servers);
  const int64_t lo = total * shard / servers, hi = total * (shard + 1) / servers;
  return {lo, hi - lo};
}

const char* status_name(WorkerState::Status s) {
  switch (s) {
    case WorkerState::Status::kUnseen:
      return "unseen";
    case WorkerState::Status::kRunning:
      return "running";
    case WorkerState::Status::kFinished:
      return "finished";
    case WorkerState::Status::kDead:
      return "dead";
  }
  return "?";
}

ShardState::ShardState(ShardOptions options, const at::Tensor& init,
                       const OptimizerFactory& make_optimizer)
    : opt_(std::move(options)), mirror_(opt_.mirror) {
  KRAB_CHECK_ARG(opt_.workers >= 1, "a parameter server needs at least one worker, got ",
                 opt_.workers);
  KRAB_CHECK(init.dim() == 1 && init.scalar_type() == at::kFloat, "shard init must be 1-D float");
  KRAB_CHECK(static_cast<bool>(opt_.lr_at), "ShardOptions::lr_at is not set");
  param_ = init.detach().clone().contiguous().set_requires_grad(true);
  optimizer_ = make_optimizer({param_});
  workers_.resize(opt_.workers);
  last_seen_.assign(opt_.workers, Clock::now());
  in_call_.assign(opt_.workers, 0);
  predicted_.assign(opt_.workers, -1);
  pushes_at_pull_.assign(opt_.workers, -1);
  others_per_step_.assign(opt_.workers, -1.0);
  KRAB_CHECK_ARG(opt_.aggregate >= 1, "sync.aggregate must be >= 1 here, got ", opt_.aggregate);
  if (opt_.max_staleness == 0) opt_.extrapolate = false;  // nothing is stale: keep no update copy
  if (opt_.max_staleness == 0 || opt_.aggregate > 1) round_sum_ = torch::zeros_like(init);
  t_warm_ = t_last_push_ = Clock::now();
}

ShardState::~ShardState() = default;

int64_t ShardState::numel() const { return param_.numel(); }

bool ShardState::live(int w) const {
  return workers_[w].status == WorkerState::Status::kUnseen ||
         workers_[w].status == WorkerState::Status::kRunning;
}

// SSP: the worker about to compute step `clock` may go once every live worker has pushed at
// least clock - s steps. For s = 0 that also means round clock - 1 has been applied (the last
// of those pushes applied it).
bool ShardState::ready_locked(int64_t clock, int worker) const {
  if (opt_.max_staleness < 0) return true;
  for (int v = 0; v < opt_.workers; ++v)
    if (v != worker && live(v) && workers_[v].clock < clock - opt_.max_staleness) return false;
  return true;
}

bool ShardState::budget_reached_locked() const {
  return opt_.total_pushes > 0 && pushes_ >= opt_.total_pushes;
}

void ShardState::count_out_silent_locked(Clock::time_point now) {
  if (mirror_ && !promoted_) return;  // a passive mirror learns who is out from its primary
  Record r;
  r.kind = Record::Kind::kCountOut;
  for (int v = 0; v < opt_.workers; ++v)
    if (live(v) && in_call_[v] == 0 && now - last_seen_[v] > opt_.worker_timeout) {
      workers_[v].status = WorkerState::Status::kDead;
      ++workers_[v].times_counted_out;
      r.workers.push_back(v);
    }
  if (!r.workers.empty()) {
    maybe_apply_round_locked();
    record_locked(std::move(r));
    cv_.notify_all();
  }
}

// After the transition it describes, so r.version is the version it led to.
void ShardState::record_locked(Record r) {
  if (!opt_.journal) return;
  r.version = version_;
  opt_.journal->append(std::move(r));
}

void ShardState::promote_locked() {
  if (!mirror_ || promoted_) return;
  promoted_ = true;
  // The workers were talking to the primary until now: their silence starts here.
  last_seen_.assign(opt_.workers, Clock::now());
  cv_.notify_all();
}

void ShardState::promote() {
  std::lock_guard<std::mutex> lock(mu_);
  promote_locked();
}

bool ShardState::replay(const Record& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!mirror_ || promoted_) return false;
  if (r.seq <= replayed_seq_) return true;  // sent again: applied already
  if (r.seq != replayed_seq_ + 1)
    throw CorruptData(str_cat("mirror: record ", r.seq, " after record ", replayed_seq_));
  const auto check_worker = [&](int w) {
    if (w < 0 || w >= opt_.workers)
      throw CorruptData(str_cat("mirror: record ", r.seq, " names worker ", w));
  };
  Step s;
  s.worker = r.worker;
  switch (r.kind) {
    case Record::Kind::kPush:
      check_worker(r.worker);
      s.clock = r.clock;
      s.grad = reinterpret_cast<const float*>(r.grad.data());
      s.grad_numel = static_cast<int64_t>(r.grad.size() / sizeof(float));
      s.base_version = r.base_version;
      workers_[r.worker].status = WorkerState::Status::kRunning;
      push_locked(s);
      break;
    case Record::Kind::kLeave:
      check_worker(r.worker);
      leave_locked(s);
      break;
    case Record::Kind::kCountOut:
      for (int w : r.workers) {
        check_worker(w);
        workers_[w].status = WorkerState::Status::kDead;
        ++workers_[w].times_counted_out;
      }
      maybe_apply_round_locked();
      break;
    case Record::Kind::kRevive:
      check_worker(r.worker);
      workers_[r.worker].status = WorkerState::Status::kRunning;
      break;
  }
  if (version_ != r.version)
    throw CorruptData(str_cat("mirror: at version ", version_, " after record ", r.seq,
                              "; the primary was at ", r.version));
  replayed_seq_ = r.seq;
  cv_.notify_all();
  return true;
}

void ShardState::apply_locked(const at::Tensor& grad, double lr_scale, int64_t t) {
  torch::NoGradGuard no_grad;
  const double lr = opt_.lr_at(t) * lr_scale;
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  param_.mutable_grad() = grad;
  if (opt_.extrapolate) {
    if (!last_update_.defined()) last_update_ = torch::empty_like(param_.detach());
    last_update_.copy_(param_.detach());  // no allocation per update: the buffer is reused
  }
  optimizer_->step();
  if (opt_.extrapolate) torch::sub_out(last_update_, param_.detach(), last_update_);
  param_.mutable_grad() = at::Tensor();  // `grad` may wrap the caller's buffer
  ++version_;
}

// s != 0, K > 1: one update from the round_count_ gradients summed (normally K), as
// round_count_ / W of a step; `pushes` counts this group's pushes.
void ShardState::apply_group_locked(int64_t pushes) {
  const double n = static_cast<double>(round_count_);
  apply_locked(round_sum_ / n, n / opt_.workers, (pushes - round_count_) / opt_.workers);
  round_sum_.zero_();
  round_count_ = 0;
}

// Server updates expected between a pull now and the push of the gradient computed from it:
// the group being filled has round_count_ of K gradients, the other workers add as many pushes
// as they did during this worker's last steps (a moving average; before the first, one each,
// as if all went at the same speed), and the puller's own push completes a group only if it is
// its K-th. A worker 3x slower than the others sees about 3 (W - 1) pushes per step.
int64_t ShardState::predicted_staleness_locked(int worker) const {
  double others = others_per_step_[worker];
  if (others < 0) {
    others = -1;
    for (int v = 0; v < opt_.workers; ++v) others += live(v) ? 1 : 0;
  }
  const int64_t expected = std::max<int64_t>(0, std::llround(others));
  return (round_count_ + expected) / opt_.aggregate;
}

// s = 0: round `version_` is complete when every live worker has pushed it.
void ShardState::maybe_apply_round_locked() {
  if (opt_.max_staleness != 0 || round_count_ == 0) return;
  for (int v = 0; v < opt_.workers; ++v)
    if (live(v) && workers_[v].clock < version_ + 1) return;
  apply_locked(round_sum_ / static_cast<double>(round_count_), 1.0, version_);
  round_sum_.zero_();
  round_count_ = 0;
}

ShardState::Reply ShardState::step(const Step& s, const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  KRAB_CHECK_ARG(s.worker >= 0 && s.worker < opt_.workers, "worker id ", s.worker,
                 " is outside 0..", opt_.workers - 1);
  const int w = s.worker;
  WorkerState& me = workers_[w];
  promote_locked();  // a mirror's first worker call: its primary is gone
  // The old primary forwarded this leave but died before answering it.
  if (promoted_ && s.leave && me.status == WorkerState::Status::kFinished)
    return {version_, {}, false, -1, opt_.journal ? opt_.journal->last_seq() : 0};
  KRAB_CHECK_ARG(me.status != WorkerState::Status::kFinished, "worker ", w, " already left");
  ++in_call_[w];
  struct Leave {
    ShardState* self;
    int w;
    ~Leave() {
      --self->in_call_[w];
      self->last_seen_[w] = Clock::now();
    }
  } leave_guard{this, w};
  last_seen_[w] = Clock::now();
  const bool revived = me.status == WorkerState::Status::kDead;
  me.status = WorkerState::Status::kRunning;  // also counts a silent worker back in
  if (revived) {
    Record r;
    r.kind = Record::Kind::kRevive;
    r.worker = w;
    record_locked(std::move(r));
  }

  if (s.grad != nullptr) {
    // A push the old primary forwarded before it died unanswered: the worker sends it again.
    if (!(promoted_ && s.clock == me.clock && s.clock > 0)) push_locked(s);
  } else {
    KRAB_CHECK_ARG(s.clock == me.clock, "worker ", w, " pulled for clock ", s.clock, " at clock ",
                   me.clock);
  }
  if (s.leave) {
    leave_locked(s);
    return {version_, {}, false, -1, opt_.journal ? opt_.journal->last_seq() : 0};
  }
  while (!budget_reached_locked() && !ready_locked(me.clock, w)) {
    if (cancelled && cancelled()) throw Error(str_cat("worker ", w, "'s call was cancelled"));
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    count_out_silent_locked(Clock::now());
  }
  return pull_locked(s);
}

void ShardState::push_locked(const Step& s) {
  const int w = s.worker;
  WorkerState& me = workers_[w];
  KRAB_CHECK_ARG(s.grad_numel == numel(), "worker ", w, " pushed ", s.grad_numel,
                 " gradient values; this shard holds ", numel());
  KRAB_CHECK_ARG(s.clock == me.clock + 1, "worker ", w, " pushed clock ", s.clock, " after clock ",
                 me.clock, " (a step was lost or repeated)");
  const at::Tensor g = torch::from_blob(const_cast<float*>(s.grad), {s.grad_numel});
  const int64_t step_index = s.clock - 1;
  if (opt_.max_staleness == 0) {
    if (step_index == version_) {
      round_sum_.add_(g);
      ++round_count_;
    } else {
      ++dropped_;  // its round was applied while the worker was counted out
    }
  } else {
    push_stale_locked(s, g);
  }
  ++pushes_;
  t_last_push_ = Clock::now();
  if (pushes_ == opt_.warmup_pushes) t_warm_ = t_last_push_;
  me.clock = s.clock;
  maybe_apply_round_locked();
  if (budget_reached_locked() && round_count_ > 0) {
    // The work is done mid-round or mid-group (a worker was counted out, or the job's
    // gradients are not a multiple of K): apply what arrived.
    if (opt_.max_staleness == 0) {
      apply_locked(round_sum_ / static_cast<double>(round_count_), 1.0, version_);
      round_sum_.zero_();
      round_count_ = 0;
    } else {
      apply_group_locked(pushes_);
    }
  }
  if (opt_.journal) {
    Record r;
    r.kind = Record::Kind::kPush;
    r.worker = w;
    r.clock = s.clock;
    r.base_version = s.base_version;
    r.grad.assign(reinterpret_cast<const char*>(s.grad), s.grad_numel * sizeof(float));
    record_locked(std::move(r));
  }
  cv_.notify_all();
}

void ShardState::push_stale_locked(const Step& s, const at::Tensor& g) {
  const int w = s.worker;
  WorkerState& me = workers_[w];
  // The version comes off the wire: one this shard never had is refused, not subtracted
  // (INT64_MIN would overflow the difference).
  KRAB_CHECK_ARG(s.base_version >= 0 && s.base_version <= version_, "worker ", w,
                 " pushed a gradient of version ", s.base_version, "; this shard is at ", version_);
  const int64_t staleness = version_ - s.base_version;
  staleness_sum_ += staleness;
  max_staleness_seen_ = std::max(max_staleness_seen_, staleness);
  // The first step says nothing about speeds: every worker pulled at once at the start.
  if (pushes_at_pull_[w] >= 0 && s.clock > 1) {
    const double seen = static_cast<double>(pushes_ - pushes_at_pull_[w]);
    // Slow enough that equal workers' jitter (2, 3 or 4 pushes between steps at W = 4)
    // does not flip the rounded count; a change of pace shows within ~10 steps.
    others_per_step_[w] = others_per_step_[w] < 0 ? seen : 0.9 * others_per_step_[w] + 0.1 * seen;
  }
  if (predicted_[w] >= 0) {
    const int64_t miss = std::abs(staleness - predicted_[w]);
    me.predicted_exactly += miss == 0 ? 1 : 0;
    ++me.predictions;
    prediction_error_sum_ += miss;
  }
  const double weight = opt_.staleness_damping ? 1.0 / (1.0 + staleness) : 1.0;
  if (opt_.aggregate == 1) {
    apply_locked(g, weight / opt_.workers, pushes_ / opt_.workers);
  } else {
    round_sum_.add_(g, weight);
    if (++round_count_ == opt_.aggregate) apply_group_locked(pushes_ + 1);
  }
}

void ShardState::leave_locked(const Step& s) {
  WorkerState& me = workers_[s.worker];
  me.status = WorkerState::Status::kFinished;
  if (s.summary) me.summary = *s.summary;
  if (!any_finished_) {
    any_finished_ = true;
    for (auto& v : workers_) v.clock_when_first_finished = v.clock;
  }
  maybe_apply_round_locked();
  Record r;
  r.kind = Record::Kind::kLeave;
  r.worker = s.worker;
  record_locked(std::move(r));
  cv_.notify_all();
}

ShardState::Reply ShardState::pull_locked(const Step& s) {
  const int w = s.worker;
  const WorkerState& me = workers_[w];
  Reply r;
  r.version = version_;
  r.seq = opt_.journal ? opt_.journal->last_seq() : 0;
  r.stop = budget_reached_locked();
  if (r.stop) return r;
  int64_t slowest = me.clock;
  for (int v = 0; v < opt_.workers; ++v)
    if (live(v)) slowest = std::min(slowest, workers_[v].clock);
  max_lead_ = std::max(max_lead_, me.clock - slowest);
  // A ticket with every push's reply and with the first pull; a pull in between (a worker
  // refreshing its copy) keeps the ticket it has.
  if (opt_.issue_tickets && (s.grad != nullptr || s.clock == 0)) r.ticket = next_ticket_++;
  r.values.resize(static_cast<size_t>(numel()) * sizeof(float));
  int64_t tau = 0;
  if (opt_.extrapolate && opt_.max_staleness != 0) {
    predicted_[w] = predicted_staleness_locked(w);
    pushes_at_pull_[w] = pushes_;
    if (last_update_.defined()) tau = predicted_[w];
  }
  if (tau > 0) {
    at::Tensor ahead = torch::from_blob(r.values.data(), {numel()});
    torch::add_out(ahead, param_.detach(), last_update_, static_cast<double>(tau));
  } else {
    std::memcpy(r.values.data(), param_.data_ptr<float>(), r.values.size());
  }
  return r;
}

bool ShardState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (int v = 0; v < opt_.workers; ++v)
    if (live(v)) return false;
  return true;
}

bool ShardState::wait_done(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    count_out_silent_locked(Clock::now());
    bool all = true;
    for (int v = 0; v < opt_.workers; ++v) all = all && !live(v);
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

at::Tensor ShardState::values() const {
  std::lock_guard<std::mutex> lock(mu_);
  return param_.detach().clone();
}

ShardStats ShardState::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ShardStats s;
  s.version = version_;
  s.pushes = pushes_;
  s.dropped = dropped_;
  s.max_staleness_seen = max_staleness_seen_;
  s.mean_staleness =
      pushes_ > 0 && opt_.max_staleness != 0 ? static_cast<double>(staleness_sum_) / pushes_ : 0;
  s.max_lead = max_lead_;
  int64_t predictions = 0;
  for (const WorkerState& w : workers_) {
    predictions += w.predictions;
    s.predicted_exactly += w.predicted_exactly;
  }
  s.mean_prediction_error =
      predictions > 0 ? static_cast<double>(prediction_error_sum_) / predictions : 0;
  if (pushes_ > opt_.warmup_pushes) {
    s.pushes_after_warmup = pushes_ - opt_.warmup_pushes;
    s.seconds_after_warmup = std::chrono::duration<double>(t_last_push_ - t_warm_).count();
  }
  s.workers = workers_;
  s.promoted = promoted_;
  s.replayed_seq = replayed_seq_;
  return s;
}

}  // namespace krab::sync
