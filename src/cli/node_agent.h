// The launcher of a machine other than node 0 in an elastic run across machines (the c10d
// rendezvous, docs/design/elastic.md §6.1-§6.4): node 0's launcher keeps the membership; this
// one, its agent on its own machine, tells the keeper what only it can see and acts on what
// the keeper decides, for its own workers only.
//
//   - A worker's exit is reported (elastic/exit/<member>, elastic/node_requests.h): the keeper
//     hears of a death at once instead of after elastic.dead_after_ms of silence.
//   - The newest generation record is read every `period`. A worker of this machine that a
//     record dropped while it was running (cut off by a partition, frozen) is killed; a worker
//     the keeper dropped, and one that found itself dropped (exit elastic::kExitDropped), is
//     started again as a joiner (the next incarnation of its slot), announced to the keeper,
//     and rejoins at a step boundary with the state of the others (§6.4). A worker that died
//     as a member is replaced only with elastic.replace_dead. Either way at most
//     elastic.max_restarts times per slot.
//
// The store is on node 0: across a partition a call to it blocks until the link returns or
// the call's timeout passes. So every store call runs on the agent's own thread; the
// launcher's loop (waitpid, signals) only queues reports and reads the last record seen. The
// client reconnects after a failed call (comm::reconnecting_store), so the calls after the
// link returns get their own answers.
//
// Thread safety: the public methods may be called from one thread while the agent's thread
// runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/store.h"
#include "elastic/generation.h"
#include "elastic/node_requests.h"

namespace krab::cli {

class NodeAgent {
 public:
  // `store`: the job's control store (node 0's TCPStore under the job secret's prefix, or the
  // run's keys in etcd).
  explicit NodeAgent(comm::StorePtr store,
                     std::chrono::milliseconds period = std::chrono::milliseconds(200));
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Queued for the agent's thread, written in order.
  void report_exit(const elastic::MemberId& member, int code, int signal);
  void announce(const elastic::Announcement& joiner);

  // The newest generation record read so far (none before the first read).
  std::optional<elastic::GenerationRecord> newest() const;

 private:
  void run();
  void read_newest();

  comm::StorePtr store_;
  const std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void(c10d::Store&)>> writes_;  // guarded by mu_
  std::optional<elastic::GenerationRecord> newest_;       // guarded by mu_
  bool stop_ = false;                                     // guarded by mu_
  std::thread thread_;
};

// Whether `record` dropped `member` while it was running: it is not among the members, and
// it did not leave by its own request (a graceful leave's proposal lists it as "left").
bool dropped_by(const elastic::GenerationRecord& record, const elastic::MemberId& member);

}  // namespace krab::cli
