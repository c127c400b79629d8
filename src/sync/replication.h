// Mirrored parameter-server shards (`sync.replicas: 1`, docs/design/elastic.md §9): the log a
// primary keeps of its shard's transitions and the thread that ships it to the mirror.
//
// A shard (sync/shard.h) changes in four ways: a worker pushes a gradient, a worker leaves, the
// shard counts silent workers out, a counted-out worker calls again. Everything else it does
// (which round to apply, when, with what learning rate) follows from these in order, by the
// same code. So the primary describes each transition as a Record, numbered 1, 2, 3, ... under
// the shard's lock, and the mirror replays the records in that order through the same methods
// of its own ShardState (ShardState::replay): with element-wise optimizers its parameters and
// optimizer state are the primary's, bit for bit, after every record. Each record also carries
// the shard's version after it, which the mirror checks (a divergence is an error, never a
// silent drift).
//
// Acknowledgement: a worker's call is answered only after the mirror has applied every record
// up to the moment the answer was made (Replicator::wait_acked), so a push the worker saw
// acknowledged is on two servers. What the mirror has is always a prefix of the primary's
// history; a worker whose push is not in it had no answer and sends it again to the mirror.
//
// Roles: the mirror takes records until its first worker call (or the chief's Finish) — then
// it promotes itself to primary and refuses every later record, so a primary that was only
// unreachable, not dead, learns from the refusal that it was deposed (Replicator::deposed) and
// answers no more calls. A mirror that cannot be reached is lost: the primary goes on alone
// (unreplicated; it says so on stderr once) rather than stopping the job.
//
// Thread safety: Replicator's methods may be called from any thread; append() is called with
// the shard's lock held and never blocks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace krab::sync {

struct Record {
  enum class Kind { kPush = 0, kLeave = 1, kCountOut = 2, kRevive = 3 };
  int64_t seq = 0;  // 1, 2, 3, ... in the order the primary applied them
  Kind kind = Kind::kPush;
  int worker = 0;            // kPush, kLeave, kRevive
  int64_t clock = 0;         // kPush: the worker's clock after it
  int64_t base_version = 0;  // kPush
  std::string grad;          // kPush: the shard's float32 gradient as received
  std::vector<int> workers;  // kCountOut: the workers counted out at once
  int64_t version = 0;       // the shard's version once this record is applied
};

// Where a shard writes its transitions (ShardOptions::journal).
class Journal {
 public:
  virtual ~Journal() = default;
  // Numbers `r` (sets r.seq) and keeps it for the mirror. Called with the shard's lock held, in
  // the order of the transitions; must not block. Returns the number.
  virtual int64_t append(Record r) = 0;
  // The number of the last record appended (0 before the first).
  virtual int64_t last_seq() const = 0;
};

// The primary's side: a Journal whose records a background thread sends to the mirror in
// order, several per call when they queue up.
class Replicator : public Journal {
 public:
  enum class SendResult { kApplied, kUnreachable, kRefused };
  // Sends records (in order, seq consecutive) to the mirror and returns when it applied them
  // (kApplied), could not be reached or failed (kUnreachable: the mirror is lost), or refused
  // them because it was promoted (kRefused: this primary is deposed). Must return within its
  // own timeout.
  using Send = std::function<SendResult(const std::vector<Record>&)>;

  // `shard` names the shard in messages. One call carries records of at most `max_batch_bytes`
  // gradient bytes (at least one record).
  Replicator(int shard, Send send, int64_t max_batch_bytes);
  ~Replicator();  // stops the sender; records not yet sent are dropped
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  int64_t append(Record r) override;
  int64_t last_seq() const override;

  enum class Outcome { kAcked, kMirrorLost, kDeposed, kTimeout };
  // Blocks until the mirror applied record `seq` (kAcked; also for seq 0), the mirror was lost
  // (kMirrorLost: the caller answers anyway, unreplicated), this primary was deposed
  // (kDeposed: the caller must not answer as primary), or `timeout` passed.
  Outcome wait_acked(int64_t seq, std::chrono::milliseconds timeout);

  bool deposed() const;
  bool mirror_lost() const;
  int64_t acked_seq() const;

 private:
  void run();

  const int shard_;
  const Send send_;
  const int64_t max_batch_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Record> queue_;
  int64_t last_seq_ = 0, acked_seq_ = 0;
  bool lost_ = false, deposed_ = false, stop_ = false;
  std::thread sender_;  // last: starts after the members it uses
};

}  // namespace krab::sync
