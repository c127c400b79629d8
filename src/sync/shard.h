// One parameter-server shard: the state machine behind `sync.mode: async`, without transport.
//
// The model's parameters, flattened in Module::parameters() order, are split into `servers`
// contiguous ranges (shard_range); each server process holds one range, its optimizer state,
// and a clock per worker. A worker's step k is: pull the parameters (from every shard),
// compute a gradient, push it with clock k + 1. One call, step(), does "push step k, then pull
// for step k + 1", so a step costs one round trip per shard.
//
// When a pull is answered (max_staleness s, stale-synchronous parallel):
//   s < 0   never waits: pure asynchronous SGD (Downpour). A slow worker never slows the
//           others; its gradients arrive stale (the report says how stale).
//   s > 0   a worker about to compute step c waits until every live worker has pushed at
//           least c - s steps: nobody runs more than s steps ahead of the slowest live worker.
//   s = 0   sync through the server: gradients of step c are summed and applied once, as their
//           average, when every live worker has pushed step c (exactly sync data parallelism,
//           any optimizer); pulls for step c + 1 wait for that.
// With s != 0 the gradients are applied in groups of `aggregate` (K), whoever sent them, as
// they arrive: every K pushes the optimizer steps once on their average with the learning rate
// lr(t) * K / W, t = pushes / W. K = W (the default) takes the steps sync takes, with the same
// batch, so learning rate, momentum and schedule carry over from sync (K-batch asynchronous
// SGD); K = 1 applies each gradient on arrival as 1/W of a step (Downpour-style). Either way
// one epoch moves the model about as far as sync does.
//
// Work: the job is `total_pushes` gradients, whoever computes them. Once that many arrived,
// every reply says stop and the workers leave, so a slow worker does fewer steps instead of
// making the others wait at the end, and the survivors of a dead worker do its share. With
// issue_tickets the replies also hand out data slices in order (ticket t = slice t % W of
// global batch t / W): each slice is computed once, by whoever asks next. With s = 0 round c's
// tickets are exactly those of global batch c, so the result is sync's.
//
// Liveness: a worker is counted out ("dead") when it has not called for `worker_timeout`
// and is not inside a call; nobody waits for it any more, and s = 0 rounds complete without
// it. A counted-out worker that calls again is counted back in. A worker that leaves
// (finished) is never waited for. The shard is done when every worker finished or is dead.
//
// Mirrors (sync.replicas: 1, sync/replication.h): a primary shard writes each transition to its
// `journal`; a shard made with `mirror` takes those records through replay(), by the same code,
// and answers nothing else until promote() (its first worker call or Finish does it). A promoted
// shard accepts a worker's push again at the clock it already has (the old primary forwarded it
// but died before answering) as a retry: it is not applied twice.
//
// Thread safety: every method may be called from any thread (the gRPC server calls step()
// from its pool, one call per worker at a time).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sync/replication.h"

namespace torch::optim {
class Optimizer;
}

namespace krab::sync {

struct ShardRange {
  int64_t offset = 0;
  int64_t numel = 0;
};

// Range of shard `shard` of `servers` over `total` elements: contiguous, sizes differ by at
// most one, together they cover 0..total.
ShardRange shard_range(int64_t total, int shard, int servers);

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

struct ShardOptions {
  int workers = 1;
  int max_staleness = -1;
  int aggregate = 1;  // K (see above); s != 0 only
  // s != 0: each gradient is scaled by 1 / (1 + staleness), staleness in updates.
  bool staleness_damping = false;
  // s != 0: answer each pull with the parameters extrapolated to where they will be when the
  // gradient computed from them is applied: w + tau * (w - w_prev), tau the server updates
  // expected before that push (see predicted_staleness_locked: the group being filled plus the
  // pushes the others made during this worker's recent steps). The gradient is then taken
  // near the point it updates, as in DANA (Hakimi et al. 2019). The shard's own values, what
  // the job saves and evaluates, are not extrapolated.
  bool extrapolate = false;
  std::chrono::milliseconds worker_timeout{10000};
  // Learning rate at global step t (t counts rounds for s = 0, pushes / workers otherwise).
  std::function<double(int64_t)> lr_at;
  // Pushes before throughput is measured (excludes start-up from samples/s).
  int64_t warmup_pushes = 0;
  // The job's work: once this many gradients were pushed, replies say `stop` (0 = never).
  int64_t total_pushes = 0;
  // Hand out data tickets 0, 1, 2, ... with the replies (server 0 does).
  bool issue_tickets = false;
  // sync.replicas: 1. A primary's journal gets every transition (sync/replication.h); a mirror
  // starts passive and takes replay() until promoted.
  std::shared_ptr<Journal> journal;
  bool mirror = false;
};

struct WorkerEval {
  int64_t step = 0;
  double seconds = 0;
  double test_accuracy = 0;  // train.metric accuracy
  double test_loss = 0;      // train.metric loss
};

struct WorkerSummary {
  int64_t steps = 0;
  double seconds = 0;
  double wait_seconds = 0;
  double final_loss = 0;
  std::vector<WorkerEval> evals;
};

struct WorkerState {
  int64_t clock = 0;
  enum class Status { kUnseen, kRunning, kFinished, kDead } status = Status::kUnseen;
  int times_counted_out = 0;
  // extrapolate: this worker's pushes that came with a prediction, and those predicted exactly
  int64_t predictions = 0, predicted_exactly = 0;
  // Clocks of the other workers when the first worker finished (-1 = not yet); shows whether
  // a slow worker held the others back.
  int64_t clock_when_first_finished = -1;
  WorkerSummary summary;  // what the worker sent when it left (server 0)
};

const char* status_name(WorkerState::Status s);

struct ShardStats {
  int64_t version = 0;             // optimizer steps applied
  int64_t pushes = 0;              // gradients received
  int64_t dropped = 0;             // s = 0: gradients for a round already applied (a worker counted
                                   // out that came back late)
  int64_t max_staleness_seen = 0;  // s != 0: updates between a gradient's pull and its push
  double mean_staleness = 0;
  // extrapolate: pushes whose staleness was the one predicted at their pull, and the mean
  // |staleness - predicted| (how well the pulls were aimed).
  int64_t predicted_exactly = 0;
  double mean_prediction_error = 0;
  int64_t max_lead = 0;             // largest (clock of a pull) - (slowest live worker's clock)
  double seconds_after_warmup = 0;  // from push warmup_pushes to the last push
  int64_t pushes_after_warmup = 0;
  std::vector<WorkerState> workers;
  bool promoted = false;     // a mirror that became this shard's primary
  int64_t replayed_seq = 0;  // a mirror: the last record it applied
};

class ShardState {
 public:
  // `init`: this shard's initial values (1-D float). `make_optimizer` gets the one tensor it
  // optimises. Throws InvalidArgument on bad options.
  ShardState(ShardOptions options, const at::Tensor& init, const OptimizerFactory& make_optimizer);
  ~ShardState();

  struct Step {
    int worker = 0;
    int64_t clock = 0;            // the worker's clock after this call's push
    const float* grad = nullptr;  // numel() floats, or nullptr for a pull only
    int64_t grad_numel = 0;
    int64_t base_version = 0;
    bool leave = false;
    const WorkerSummary* summary = nullptr;  // with leave
  };
  struct Reply {
    int64_t version = 0;
    std::string values;   // numel() floats as bytes; empty after leave or with stop
    bool stop = false;    // total_pushes reached: the worker should leave
    int64_t ticket = -1;  // with issue_tickets: the next data slice this worker computes
    // With a journal: the last record this reply depends on (the caller waits until the
    // mirror has it before answering).
    int64_t seq = 0;
  };

  // Push then pull (see the header comment). `cancelled` is polled while waiting (the caller
  // went away). Throws InvalidArgument for a worker id out of range, a gradient of the wrong
  // length or a clock that does not follow the worker's previous one; Error("cancelled").
  Reply step(const Step& s, const std::function<bool()>& cancelled);

  // A mirror: applies `r` as the primary did. Returns false, applying nothing, on a shard
  // that is no mirror or was promoted (the record comes from a deposed primary). A record already
  // applied (seq not above the last) is skipped; CorruptData for a gap in the numbers or when the
  // version after it is not the primary's (the two have diverged).
  bool replay(const Record& r);
  // A mirror becomes the primary: it stops taking records and counts workers silent from now
  // on. No effect on a primary.
  void promote();

  // Blocks until every worker finished or was counted out, or `timeout` passed (returns false).
  bool wait_done(std::chrono::milliseconds timeout);
  bool done() const;

  int64_t numel() const;
  bool mirror() const { return mirror_; }  // made as a mirror (promoted or not)
  at::Tensor values() const;               // a copy
  ShardStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  bool ready_locked(int64_t clock, int worker) const;
  bool budget_reached_locked() const;
  void count_out_silent_locked(Clock::time_point now);
  void maybe_apply_round_locked();
  void apply_group_locked(int64_t pushes);
  void apply_locked(const at::Tensor& grad, double lr_scale, int64_t t);
  int64_t predicted_staleness_locked(int worker) const;
  void record_locked(Record r);
  void promote_locked();
  bool live(int w) const;
  // The parts of step(), in order, with mu_ held. push_locked checks and takes in the
  // gradient (push_stale_locked: s != 0, where it is applied or grouped as it arrives);
  // leave_locked marks the worker finished; pull_locked answers with the values.
  void push_locked(const Step& s);
  void push_stale_locked(const Step& s, const at::Tensor& grad);
  void leave_locked(const Step& s);
  Reply pull_locked(const Step& s);

  ShardOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  at::Tensor param_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<WorkerState> workers_;
  std::vector<Clock::time_point> last_seen_;
  std::vector<int> in_call_;
  std::vector<int64_t> predicted_;  // extrapolate: tau given with each worker's last pull
  // extrapolate: pushes_ when each worker's last pull was answered, and the others' pushes
  // seen between a pull and the worker's next push (a moving average; -1 = none yet).
  std::vector<int64_t> pushes_at_pull_;
  std::vector<double> others_per_step_;
  int64_t prediction_error_sum_ = 0;  // the per-worker counts are in workers_
  int64_t version_ = 0;
  int64_t pushes_ = 0;
  int64_t dropped_ = 0;
  int64_t staleness_sum_ = 0, max_staleness_seen_ = 0, max_lead_ = 0;
  at::Tensor round_sum_;    // s = 0, or K > 1
  at::Tensor last_update_;  // extrapolate: the last update, param after - param before
  int64_t round_count_ = 0;
  int64_t next_ticket_ = 0;
  bool any_finished_ = false;
  bool mirror_ = false, promoted_ = false;
  int64_t replayed_seq_ = 0;
  Clock::time_point t_warm_, t_last_push_;
};

}  // namespace krab::sync
