#include "cli/node_agent.h"

#include "elastic/membership_view.h"

namespace krab::cli {

NodeAgent::NodeAgent(const comm::Endpoint& control, std::chrono::milliseconds timeout,
                     std::chrono::milliseconds period)
    : store_(comm::reconnecting_store(control, timeout)), period_(period) {
  thread_ = std::thread([this] { run(); });
}

NodeAgent::~NodeAgent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  // A call blocked on a cut link returns within the store's timeout; the launcher exits after
  // its workers, so waiting for it here costs at most that once.
  thread_.join();
}

void NodeAgent::report_exit(const elastic::MemberId& member, int code, int signal) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.push_back([=](c10d::Store& s) { elastic::report_exit(s, member, code, signal); });
  }
  wake_.notify_all();
}

void NodeAgent::announce(const elastic::Announcement& joiner) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.push_back([=](c10d::Store& s) { elastic::announce_joiner(s, joiner); });
  }
  wake_.notify_all();
}

std::optional<elastic::GenerationRecord> NodeAgent::newest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_;
}

// Writes first (an exit report is what the keeper waits for), then the newest record. A call
// that fails (the store unreachable for longer than its timeout) is retried: a write stays at
// the head of the queue.
void NodeAgent::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    while (!writes_.empty() && !stop_) {
      auto write = writes_.front();
      lock.unlock();
      bool done = true;
      try {
        write(*store_);
      } catch (const std::exception&) {
        done = false;
      }
      lock.lock();
      if (!done) break;
      writes_.pop_front();
    }
    lock.unlock();
    try {
      read_newest();
    } catch (const std::exception&) {  // unreachable now: read again next time
    }
    lock.lock();
    wake_.wait_for(lock, period_, [this] { return stop_ || !writes_.empty(); });
  }
}

void NodeAgent::read_newest() {
  const int64_t g = elastic::current_generation(*store_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (g < 0 || (newest_ && newest_->generation >= g)) return;
  }
  elastic::GenerationRecord record = elastic::read_record(*store_, g);
  std::lock_guard<std::mutex> lock(mu_);
  newest_ = std::move(record);
}

bool dropped_by(const elastic::GenerationRecord& record, const elastic::MemberId& member) {
  for (const elastic::Member& m : record.members)
    if (m.id == member) return false;
  for (const elastic::LostMember& l : record.lost)
    if (l.id == member && l.cause == "left") return false;
  return true;
}

}  // namespace krab::cli
