#include "comm/reaper.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>

namespace krab::comm {

struct Reaper::State {
  mutable std::mutex mu;
  std::condition_variable work;          // something was buried, or the reaper stops
  mutable std::condition_variable idle;  // pending went down
  std::deque<std::unique_ptr<Communicator>> queue;
  size_t pending = 0;
  bool stop = false;
};

// The state is held by shared_ptr: after a detach at exit the thread may outlive the Reaper.
// Destroying one group happens outside the lock, so bury() never waits for it.
void Reaper::reap(const std::shared_ptr<State>& state) {
  std::unique_lock<std::mutex> lock(state->mu);
  for (;;) {
    state->work.wait(lock, [&] { return state->stop || !state->queue.empty(); });
    if (state->queue.empty()) return;  // stopping, and nothing left
    std::unique_ptr<Communicator> comm = std::move(state->queue.front());
    state->queue.pop_front();
    lock.unlock();
    comm.reset();  // may block until Gloo's timeout ends the op it was in
    lock.lock();
    --state->pending;
    state->idle.notify_all();
  }
}

Reaper::Reaper(std::chrono::milliseconds exit_bound)
    : state_(std::make_shared<State>()), exit_bound_(exit_bound) {}

Reaper::~Reaper() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stop = true;
  state_->work.notify_all();
  const bool drained =
      state_->idle.wait_for(lock, exit_bound_, [&] { return state_->pending == 0; });
  const size_t left = state_->pending;
  lock.unlock();
  if (!thread_.joinable()) return;
  if (drained) {
    thread_.join();
    return;
  }
  std::fprintf(stderr,
               "krab: %zu abandoned communicator(s) still closing after %.1f s; not waiting "
               "for them\n",
               left, exit_bound_.count() / 1000.0);
  thread_.detach();
}

void Reaper::bury(std::unique_ptr<Communicator> comm) {
  if (!comm) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->queue.push_back(std::move(comm));
  ++state_->pending;
  if (!thread_.joinable()) {
    auto state = state_;
    thread_ = std::thread([state] { reap(state); });
  }
  state_->work.notify_one();
}

size_t Reaper::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->pending;
}

bool Reaper::wait_idle(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->idle.wait_for(lock, timeout, [&] { return state_->pending == 0; });
}

Reaper& Reaper::process() {
  // Constructed at the first use, after LibTorch's own statics, so destroyed before them: the
  // groups it still holds are destroyed while c10d is intact.
  static Reaper reaper;
  return reaper;
}

}  // namespace krab::comm
