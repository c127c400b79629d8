// Keeper: the one decider of an elastic run's membership (docs/design/elastic.md §1.3, §2.3-§2.5,
// §6.4). A pure state machine: adapters feed it what they observe, with the time, and write
// the generation records it returns. It reads no clock, store or process table itself, so every
// decision below is unit-tested with synthetic events and a fake clock.
//
//   one machine:    the launcher's Supervisor (waitpid: ChildExited), a 100 ms poll of the
//                   heartbeat records g<g>/hb/<r> (Heartbeat, HeartbeatTick, WaitTick) and of
//                   elastic/{suspect,leave,join}/* (Suspect, LeaveRequest, JoinRequest);
//   across machines: the leader agent, the same events plus LeaseExpired from etcd.
//
// The protocol, per call of on_events(events, now):
//   1. every event updates what the keeper knows (who died, who beat when, who asks to leave
//      or join); none decides on its own;
//   2. then at most one record is decided for the whole batch: generation g+1 =
//        the members of g that are not lost, in their old rank order, then the admitted
//        joiners in the order they asked, ranked 0..W'-1;
//      kind abort when any member was lost by failure (its group g is broken), else proposal
//      (join, leave: g finishes its step and switches after the commit vote, §2.2);
//      state run when W' >= min_workers, else waiting; stop when WaitTick finds the run has
//      been waiting for wait_s.
//   The returned record is the next generation, g+1, every time: numbers are consecutive and a
//   number is never reused, because the keeper never returns a record twice and never changes
//   one it returned. Two changes in two calls are two generations, g+1 then g+2.
//
// What counts as lost (each with the cause the record's `lost` line carries):
//   - ChildExited with a signal or a non-zero status: "killed by signal 9", "exited with
//     status 1". Status 0 is not a death: a worker exits 0 when it left by request (it is no
//     longer a member then) or when the run ended; the keeper stops watching its heartbeats.
//   - HeartbeatTick: no heartbeat for dead_after_ms or longer (exactly dead_after_ms is dead,
//     one millisecond less is not): "no heartbeat for 3000 ms". A member's heartbeat clock
//     starts when it enters a generation (its beats come from that generation's group), so a
//     member of g+1 that never arrives is lost dead_after_ms after the decision.
//   - Suspect (a member's op of generation g failed with peer Y, or with an unnamed peer: then
//     every member is checked): checked at once; Y is lost only when its beats are stale —
//     none for 3 heartbeat periods (3 x heartbeat_ms, at most dead_after_ms): a single late
//     beat is not a death. A report whose peers all look alive changes nothing now, but the
//     reporter's group is broken: if g is still current dead_after_ms after the first such
//     report, the next HeartbeatTick writes g+1 with the same live members, reason
//     "group error" (§13); later reports do not put that deadline off.
//     Reports about an older generation are dropped (that group is gone already).
//   - LeaseExpired: every member on that node ("lease of node 2 expired").
//   - LeaveRequest: "left" (a proposal: nothing is broken).
// JoinRequest admits a new member id up to max_workers; a refused join (max_workers reached,
// an id used before in this run — a replacement is a new incarnation —, the run stopped) is
// queued as a Refusal for the adapter to publish (elastic/refused/<member>) and print.
// Events about members that are not in the current generation are ignored.
//
// Thread safety: none; one adapter thread owns a Keeper.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "elastic/generation.h"

namespace krab::elastic {

// The keys of §7 the keeper needs, with their defaults. The adapter copies them from the
// resolved config; validated by Keeper's constructor (InvalidArgument naming the key).
struct KeeperOptions {
  int min_workers = 1;           // elastic.min_workers, >= 1
  int max_workers = 0;           // elastic.max_workers; 0: the initial number of workers
  int64_t heartbeat_ms = 200;    // elastic.heartbeat_ms, > 0
  int64_t dead_after_ms = 3000;  // elastic.dead_after_ms, > 0
  double wait_s = 60;            // elastic.wait_s, >= 0
};

// A moment as the adapter reads it: steady_ms (a monotonic clock) for every interval the
// keeper measures, unix_ms for the decided_at of the records it writes.
struct Instant {
  int64_t steady_ms = 0;
  int64_t unix_ms = 0;
};

namespace event {
// A worker process of this node ended: exit status `code`, or killed by `signal` (non-zero).
struct ChildExited {
  MemberId member;
  int code = 0;
  int signal = 0;
};
// The member's heartbeat record moved (observed at `now`).
struct Heartbeat {
  MemberId member;
};
// Time to check every member's heartbeats (and the suspect reports' deadlines).
struct HeartbeatTick {};
// `reporter`'s op of `generation` failed with `peer` (nullopt: Gloo did not say which).
struct Suspect {
  MemberId reporter;
  std::optional<MemberId> peer;
  int64_t generation = 0;
};
// The member asks to leave at the next step boundary (SIGTERM, autoscale).
struct LeaveRequest {
  MemberId member;
};
// A new process asks to join, already admitted by secret and fingerprint (§6.3). Its node is
// member.node; local_rank and pid go into its Member line.
struct JoinRequest {
  MemberId member;
  int local_rank = 0;
  int64_t pid = 0;
};
// The etcd lease of `node`'s agent expired: the machine or its network is gone.
struct LeaseExpired {
  int node = 0;
};
// Rank 0 completed `step` (elastic/progress): the next record's decided_step.
struct Progress {
  int64_t step = 0;
};
// Time to check whether waiting for min_workers has lasted wait_s.
struct WaitTick {};
}  // namespace event

using Event = std::variant<event::ChildExited, event::Heartbeat, event::HeartbeatTick,
                           event::Suspect, event::LeaveRequest, event::JoinRequest,
                           event::LeaseExpired, event::Progress, event::WaitTick>;

// A join the keeper turned down, with a line the joiner's launcher prints before exiting 2.
struct Refusal {
  MemberId member;
  std::string reason;
};

class Keeper {
 public:
  // The store a generation's group is built in (the record's `store`): on one machine
  // "file DIR/g<g>.store", across machines the leader's TCPStore "HOST:PORT".
  using StoreNamer = std::function<std::string(int64_t generation)>;

  // Generation 0 is `initial`, ranked in the order given (their `rank` fields are ignored),
  // reason "start", state run (waiting if fewer than min_workers). Throws InvalidArgument for
  // options out of range (naming the elastic.* key), a repeated member id, or more initial
  // members than max_workers.
  Keeper(const KeeperOptions& options, std::vector<Member> initial, StoreNamer store_for,
         Instant now);

  // Takes over a run whose newest record is `current`, written by another keeper (the
  // previous leader across machines, §6.2): its members are watched from `now`, their ids
  // count as used. `options.max_workers` must be resolved (> 0: the new leader knows the job's
  // parallel.workers). Nothing is published: call relocate() next.
  Keeper(const KeeperOptions& options, const GenerationRecord& current, StoreNamer store_for,
         Instant now);

  // The group's store died with the previous leader: the next generation is built in this
  // keeper's (store_for). Drops the members of `dead_nodes` (their agents' leases expired:
  // "lease of node N expired") and makes a record of kind abort even when nobody is lost
  // (reason "leader", the same members), so every member rebuilds its group there. Nullopt
  // only when the run had stopped.
  std::optional<GenerationRecord> relocate(const std::vector<int>& dead_nodes, Instant now);

  // Applies the events, then decides (see the header comment). Returns the record of the next
  // generation to write, or nullopt when membership does not change. After a record with
  // state stop, returns nullopt forever (joins are refused).
  std::optional<GenerationRecord> on_events(const std::vector<Event>& events, Instant now);
  std::optional<GenerationRecord> on_event(const Event& event, Instant now) {
    return on_events({event}, now);
  }

  // The newest record: generation 0 until the first change.
  const GenerationRecord& current() const { return current_; }
  // The refusals since the last call, oldest first.
  std::vector<Refusal> take_refusals();
  bool stopped() const { return current_.state == RecordState::kStop; }
  // max_workers after resolving 0 to the initial number of workers.
  int max_workers() const { return max_workers_; }

 private:
  struct Watch {
    int64_t last_beat_ms = 0;
    bool exited = false;  // exited with status 0: nothing more to watch
  };
  struct Change;  // what one batch of events found, keeper.cpp

  void apply(const Event& event, Instant now, Change* change);
  void on_exit(const event::ChildExited& e, Change* change);
  void on_heartbeat_tick(Instant now, Change* change);
  void on_suspect(const event::Suspect& e, Instant now, Change* change);
  void on_join(const event::JoinRequest& e, Change* change);
  std::optional<GenerationRecord> decide(const Change& change, Instant now);
  bool is_member(const MemberId& id) const { return watch_.count(id) != 0; }

  KeeperOptions options_;
  int max_workers_ = 0;
  StoreNamer store_for_;
  GenerationRecord current_;
  std::map<MemberId, Watch> watch_;          // the members of current_
  std::set<MemberId> used_;                  // every id that was ever a member
  std::optional<int64_t> suspected_at_ms_;   // first report of g that found all peers alive
  std::optional<int64_t> waiting_since_ms_;  // when the run fell below min_workers
  int64_t newest_step_ = 0;
  std::vector<Refusal> refusals_;
};

}  // namespace krab::elastic
