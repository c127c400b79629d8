#include "sync/replication.h"

#include <cstdio>
#include <exception>

namespace krab::sync {

Replicator::Replicator(int shard, Send send, int64_t max_batch_bytes)
    : shard_(shard),
      send_(std::move(send)),
      max_batch_bytes_(max_batch_bytes),
      sender_([this] { run(); }) {}

Replicator::~Replicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  sender_.join();
}

int64_t Replicator::append(Record r) {
  std::lock_guard<std::mutex> lock(mu_);
  r.seq = ++last_seq_;
  // Once the mirror is gone nothing is kept: no record would ever leave the queue.
  if (!lost_ && !deposed_) {
    queue_.push_back(std::move(r));
    cv_.notify_all();
  }
  return last_seq_;
}

int64_t Replicator::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

Replicator::Outcome Replicator::wait_acked(int64_t seq, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return acked_seq_ >= seq || lost_ || deposed_; });
  // Deposed wins over acked: another server answers for this shard now, and answers from
  // here could contradict its.
  if (deposed_) return Outcome::kDeposed;
  if (acked_seq_ >= seq) return Outcome::kAcked;
  return lost_ ? Outcome::kMirrorLost : Outcome::kTimeout;
}

bool Replicator::deposed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return deposed_;
}

bool Replicator::mirror_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

int64_t Replicator::acked_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return acked_seq_;
}

// One call in flight at a time keeps the mirror's order the primary's without sequencing on
// the other side; while it is in flight the next records queue up and leave together.
void Replicator::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::vector<Record> batch;
    int64_t bytes = 0;
    while (!queue_.empty() &&
           (batch.empty() ||
            bytes + static_cast<int64_t>(queue_.front().grad.size()) <= max_batch_bytes_)) {
      bytes += static_cast<int64_t>(queue_.front().grad.size());
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    lock.unlock();
    SendResult result = SendResult::kUnreachable;
    std::string why;
    try {
      result = send_(batch);
    } catch (const std::exception& e) {
      why = e.what();  // a sender that throws has lost its mirror as surely as one that fails
    }
    lock.lock();
    if (result == SendResult::kApplied) {
      acked_seq_ = batch.back().seq;
    } else {
      (result == SendResult::kRefused ? deposed_ : lost_) = true;
      queue_.clear();
      std::fprintf(stderr,
                   result == SendResult::kRefused
                       ? "krab: parameter server: shard %d's mirror was promoted; this server "
                         "no longer answers for shard %d%s%s\n"
                       : "krab: parameter server: shard %d's mirror is lost; shard %d goes on "
                         "without a copy%s%s\n",
                   shard_, shard_, why.empty() ? "" : ": ", why.c_str());
    }
    cv_.notify_all();
    if (result != SendResult::kApplied) return;
  }
}

}  // namespace krab::sync
