#include "data/prefetch.h"

#include <chrono>
#include <iterator>

#include "core/errors.h"

namespace krab::data {

BatchPrefetcher::BatchPrefetcher(Plan plan, Produce produce, int threads, int depth,
                                 int64_t end_step)
    : plan_(std::move(plan)), produce_(std::move(produce)), depth_(depth), end_step_(end_step) {
  KRAB_CHECK_ARG(threads >= 1, "data.decode_threads must be >= 1, got ", threads);
  KRAB_CHECK_ARG(depth >= 1, "prefetch depth must be >= 1, got ", depth);
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void BatchPrefetcher::work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto [step, job] = std::move(queue_.front());
    queue_.pop_front();
    if (job->dropped) continue;
    job->started = true;
    lock.unlock();
    Batch batch;
    std::exception_ptr error;
    try {
      batch = produce_(step, job->idx);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job->batch = std::move(batch);
    job->error = error;
    job->done = true;
    cv_.notify_all();
  }
}

// Queues steps step+1 .. step+depth that are not queued yet; drops the ones at or before
// `step` and those guessed with another slice.
void BatchPrefetcher::schedule_after(int64_t step, BatchSlice part) {
  std::vector<std::pair<int64_t, std::shared_ptr<Pending>>> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      const bool stale = it->first <= step || it->second->part.begin != part.begin ||
                         it->second->part.end != part.end;
      if (!stale) {
        ++it;
        continue;
      }
      it->second->dropped = true;  // a thread that has not begun it skips it
      it = pending_.erase(it);
    }
    for (int64_t s = step + 1; s <= step + depth_ && s < end_step_; ++s)
      if (!pending_.count(s)) fresh.emplace_back(s, nullptr);
  }
  // The sampler runs outside the lock: the threads keep working meanwhile.
  for (auto& [s, job] : fresh) {
    job = std::make_shared<Pending>();
    job->part = part;
    job->idx = plan_(s, part);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : fresh) {
      pending_[entry.first] = entry.second;
      queue_.push_back(entry);
    }
  }
  cv_.notify_all();
}

BatchPrefetcher::Batch BatchPrefetcher::get(int64_t step, BatchSlice part) {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Pending> job;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = pending_.find(step);
    if (it != pending_.end() && it->second->part.begin == part.begin &&
        it->second->part.end == part.end)
      job = it->second;
    if (job && !job->started) {
      // Not begun yet (the threads are behind): make it here rather than wait in line.
      job->dropped = true;
      pending_.erase(it);
      job.reset();
    } else if (job) {
      cv_.wait(lock, [&] { return job->done; });
    }
  }
  Batch batch;
  if (job) {
    if (job->error) std::rethrow_exception(job->error);
    batch = std::move(job->batch);
  } else {
    batch = produce_(step, plan_(step, part));
  }
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  schedule_after(step, part);
  return batch;
}

}  // namespace krab::data
