// Batches made ahead of the training thread, on background threads.
//
// The training thread asks for the batch of sampler step s and slice p (what the engine's
// StepPlan says this rank computes). The prefetcher guesses that the next steps come in order
// with the same slice, which is what every engine does today (a fixed equal slice per rank), and
// keeps the batches of steps s+1 .. s+depth in the making on its threads while the training
// thread computes step s. A guess that turns out wrong (an engine that hands out another slice,
// a resume) costs nothing but time: that batch is then made on the calling thread, and the
// stale ones are dropped.
//
// Which examples a batch holds is decided on the calling thread (Plan: the sampler, which is
// not thread-safe, is only ever called there); only Produce, the expensive part (gathering,
// decoding, augmenting), runs on the background threads, and it must be safe to call from
// several threads at once. A batch is a function of (step, indices) alone, so prefetching
// changes no number a run computes.
//
// Waiting: get() measures the time the calling thread spends blocked on a batch (or making one
// itself); waited_seconds() is the total, the number the report's data_wait_fraction is made of.
//
// Failure: an exception thrown by Produce on a background thread is kept and rethrown by the
// get() that asks for that batch. The destructor stops the threads after the batch each is
// making (it does not wait for the batches queued behind).
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "data/sampler.h"

namespace krab::data {

class BatchPrefetcher {
 public:
  using Batch = std::pair<at::Tensor, at::Tensor>;
  // The example indices of sampler step `step`, slice `part` (on the calling thread).
  using Plan = std::function<std::vector<int64_t>(int64_t step, BatchSlice part)>;
  // The batch of those indices at that step (on any thread).
  using Produce = std::function<Batch(int64_t step, const std::vector<int64_t>& idx)>;

  // `threads` >= 1 background threads keep up to `depth` >= 1 batches ahead; steps at or after
  // `end_step` are never prefetched (they are still made when asked for).
  BatchPrefetcher(Plan plan, Produce produce, int threads, int depth, int64_t end_step);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The batch of `step` / `part`; then queues the next steps. Rethrows Produce's exception.
  Batch get(int64_t step, BatchSlice part);

  // Seconds get() has spent waiting for batches (or making them itself), in total.
  double waited_seconds() const { return waited_; }

 private:
  struct Pending {
    BatchSlice part;
    std::vector<int64_t> idx;
    bool started = false, done = false;
    bool dropped = false;  // no longer wanted: a thread that has not begun it skips it
    Batch batch;
    std::exception_ptr error;
  };
  void work();
  void schedule_after(int64_t step, BatchSlice part);

  const Plan plan_;
  const Produce produce_;
  const int depth_;
  const int64_t end_step_;
  double waited_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;  // a batch is queued or done, or stop_ was set
  bool stop_ = false;
  std::map<int64_t, std::shared_ptr<Pending>> pending_;             // by step
  std::deque<std::pair<int64_t, std::shared_ptr<Pending>>> queue_;  // not yet started
  std::vector<std::thread> threads_;
};

}  // namespace krab::data
