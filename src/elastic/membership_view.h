// Where generation records live in the store, and how a worker watches them (design
// docs/design/elastic.md §1.1, §1.3, §2.3 t1).
//
// The keeper is the only writer: `publish_record` puts `elastic/gen/<g>` once (a compare-and-set
// from absent, so a record is never changed — invariant 1) and then moves `elastic/current` to
// g. Workers never decide anything: each runs one `MembershipView`, a thread that polls
// `elastic/current` every `period` and reads every record it has not seen, in order. When a
// record of kind abort arrives for a generation newer than the one the worker runs, the view
// calls `on_abort` at once (the elastic engine aborts its group there, so every pending wait of
// the broken generation throws MembershipChanged); proposals are only remembered — the commit
// vote carries them to every rank at the same step boundary.
//
// The records travel through a store every worker of the node can write (the launcher's
// FileStore, node 0's TCPStore, or an agent's mirror of etcd), so `decode` treats them as
// untrusted: a malformed record stops the view, and `wait_for` rethrows its CorruptData naming
// the key. A store that fails to answer does not stop it: across machines a cut link (§6.4)
// makes every call fail until the link returns, and a worker cut off must still learn then
// that the keeper dropped it. The view polls on (give it comm::reconnecting_store's client) and
// `wait_for`'s timeout is the bound.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "comm/store.h"
#include "elastic/generation.h"

namespace krab::elastic {

// The store keys of the records.
std::string record_key(int64_t generation);  // "elastic/gen/<g>"
inline constexpr const char* kCurrentKey = "elastic/current";

// Writes `record` as generation record.generation and makes it current. The key must be absent
// or already hold these exact bytes (a keeper that restarts and publishes again is harmless);
// other bytes there throw InvalidArgument naming the generation — a record is never rewritten.
// `elastic/current` only moves forward.
void publish_record(c10d::Store& store, const GenerationRecord& record);

// The newest generation published, or -1 when none is (non-blocking).
int64_t current_generation(c10d::Store& store);

// Rank 0 of the running generation writes the steps the group completed after each step and
// the Unix time it completed them (`elastic/progress` = "<steps> <seconds with 6 decimals>");
// the keeper reads the steps for the records' decided_step, the autoscale policy both.
inline constexpr const char* kProgressKey = "elastic/progress";
// A worker's requests to the keeper, under its member id: `elastic/join/<member>` = its pid (a
// joiner, before it is a member), `elastic/leave/<member>` = "1" (a graceful leave, §2.4).
inline constexpr const char* kJoinPrefix = "elastic/join/";
inline constexpr const char* kLeavePrefix = "elastic/leave/";
void request_join(c10d::Store& store, const MemberId& member, int64_t pid);
void request_leave(c10d::Store& store, const MemberId& member);
void publish_progress(c10d::Store& store, int64_t steps);

// Record `generation`, which must have been published (blocking up to the store's timeout).
GenerationRecord read_record(c10d::Store& store, int64_t generation);

class MembershipView {
 public:
  using OnAbort = std::function<void(const GenerationRecord&)>;
  // Starts the thread. `running`: the generation this worker runs now; records up to it are
  // taken as seen. `on_abort` runs on the view's thread, once per abort record newer than
  // `running` (it must be quick and thread-safe: Communicator::abort is).
  MembershipView(comm::StorePtr store, int64_t running, std::chrono::milliseconds period,
                 OnAbort on_abort);
  ~MembershipView();  // stops and joins the thread (within one period)
  MembershipView(const MembershipView&) = delete;
  MembershipView& operator=(const MembershipView&) = delete;

  // The newest generation whose record this view has read (the vote's slot, §2.2).
  int64_t newest() const { return newest_.load(); }
  // Blocks until record `generation` has been read, and returns it. Throws krab::Timeout after
  // `timeout` (naming the store's last error if it is failing), or the CorruptData that
  // stopped the view.
  GenerationRecord wait_for(int64_t generation, std::chrono::milliseconds timeout);

 private:
  void run();
  void poll();

  comm::StorePtr store_;
  const std::chrono::milliseconds period_;
  OnAbort on_abort_;
  std::atomic<int64_t> newest_;
  int64_t running_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<int64_t, GenerationRecord> records_;  // guarded by mu_
  std::exception_ptr error_;                     // guarded by mu_
  std::string store_error_;                      // guarded by mu_; "" once a poll succeeds
  bool stop_ = false;                            // guarded by mu_
  std::thread thread_;
};

}  // namespace krab::elastic
