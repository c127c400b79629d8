// LocalKeeper: the keeper of an elastic run on one machine (docs/design/elastic.md §1.3, §3.3,
// §6.1), the adapter between the launcher's Supervisor and the pure Keeper (keeper.h).
//
// The launcher owns the job's control store (a FileStore in its private directory, the file the
// workers get as KRAB_STORE_FILE, under the job secret's prefix) and sees every child exit at
// once. The Supervisor drives a LocalKeeper from its waitpid loop:
//
//   LocalKeeper keeper(options, members, now);     // publishes generation 0
//   loop:
//     on a child's exit:  keeper.on_child_exit(member, code, signal)     (queued)
//     every poll_period, and at once after exits:
//       if (auto record = keeper.poll(now)) { print describe_change(...); workers.json }
//
// poll(now) reads, through one long-lived client each:
//   - the heartbeat records of the current generation's group (comm::PeerMonitor's "hb/<rank>"
//     under "g<g>/" in the generation's store): a beat that moved is event::Heartbeat for the
//     member at that rank;
//   - elastic/progress (rank 0's decimal count of completed steps, possibly followed by a space
//     and more): event::Progress;
//   - elastic/suspect/<member id> ("<generation> <peer member id or ->"), when its text
//     changed: event::Suspect (a malformed report is ignored: reports are hints);
//   - elastic/leave/<member id> (a worker's graceful leave after SIGTERM, §2.4), once per
//     member: event::LeaveRequest, which the Keeper turns into a proposal without it;
// and feeds them with the queued exits, HeartbeatTick and WaitTick to Keeper::on_events as one
// batch, so members found dead together are one record. When the generation's store cannot be
// opened, that poll has no HeartbeatTick: the keeper's own trouble is no worker's silence. A record
// the Keeper decides is published (publish_record: elastic/gen/<g> once, then elastic/current)
// after its store file exists, and returned.
//
// Generation g >= 1 builds its group in a fresh FileStore file, store_dir/g<g>.store ("file
// PATH" in the record), created here (mode 0600) before the record is published, so a worker
// that reads the record can open it. Generation 0's group lives in the control store itself
// (the workers build it there as without elastic, prefix g0/). Across machines (options.nodes
// > 1) the control store is node 0's TCPStore, which every generation shares under its own
// prefix (a TCPStore keeps no log to replay), and the other launchers' reports are read too:
// exits, announced joiners and machines asking to join (elastic/node_requests.h).
//
// A generation's store file (g >= 1) is unlinked once `start_grace` (the launcher gives
// comm.timeout_s, the bound of any op of the abandoned group, §3.2) has passed since the next
// generation replaced it: the long-running job does not keep every generation's log on disk.
//
// Start-up grace: a member of generation 0 that has not beaten yet is not timed out until
// `start_grace` has passed (a worker loads LibTorch, its data and model before its group and
// heartbeats exist; on a loaded machine that takes longer than dead_after_ms). Once a member's
// first beat is seen, or in any later generation (a survivor rebuilds its group in-process
// within milliseconds), the Keeper's dead_after_ms rule applies unchanged.
//
// Thread safety: none; the Supervisor's thread owns it. Store failures propagate from the
// constructor (the control store must work) and are swallowed in poll()'s reads (a read that
// fails this time is retried next poll); publishing a record throws.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/store.h"
#include "elastic/autoscale.h"
#include "elastic/keeper.h"

namespace krab::elastic {

struct LocalKeeperOptions {
  KeeperOptions keeper;
  comm::Endpoint control;  // the job's FileStore (file and secret), as the workers reach it
  std::string store_dir;   // where g<g>.store files are created (the launcher's private dir)
  std::chrono::milliseconds start_grace{60000};  // see above; the launcher gives comm.timeout_s
  // elastic.autoscale.provider local: the policy (elastic/autoscale.h) reads rank 0's progress
  // records; its decisions come back through take_scale_decision() for the launcher to carry
  // out (start a joiner in a new slot, or ask the newest member to leave).
  std::optional<AutoscaleOptions> autoscale;
  // The provider's capacity (elastic/providers/provider.h), asked when the policy may add; the
  // policy sees the smaller of it and the room below max_workers. Empty: no bound of its own.
  std::function<int()> capacity;
  // Machines at the start (--nnodes). Above 1 the control store is node 0's TCPStore
  // (control.file empty): every generation's group is built in it, under its own "g<g>/"
  // prefix ("HOST:PORT" in the records), and the other machines' launchers report their
  // workers' exits and the joiners they start there (elastic/node_requests.h).
  int nodes = 1;
  // `krab train --join`: "" admits the machine that sent `fingerprint` as node `node`; any
  // other text refuses it with these words. Empty: every request is refused.
  std::function<std::string(const std::string& fingerprint, int node)> admit;
  // The etcd rendezvous (§6.2): the records and every request live in `control_store` (an
  // EtcdStore, fenced on the leader key) instead of a store at `control`, and the groups are
  // built in this keeper's own TCPStore at `groups` (its HOST:PORT in the records).
  comm::StorePtr control_store;
  comm::Endpoint groups;
};

// Instant now, from the steady and the system clock.
Instant now_instant();

class LocalKeeper {
 public:
  // Publishes generation 0: `initial` in rank order (their rank fields are ignored), store
  // "file <control.file>". Throws what Keeper's constructor throws, or a store error.
  LocalKeeper(LocalKeeperOptions options, std::vector<Member> initial, Instant now);
  // The etcd rendezvous's new leader: takes over the run at `current` (read from etcd) and
  // publishes the next generation in its own store (Keeper::relocate), without the members of
  // `dead_nodes`. `options.keeper.max_workers` must be resolved.
  LocalKeeper(LocalKeeperOptions options, const GenerationRecord& current,
              const std::vector<int>& dead_nodes, Instant now);

  // Queues a child's exit (wait status decoded: exit `code`, or killed by `signal` != 0) for
  // the next poll(). Exits of processes that are no longer members are ignored by the Keeper.
  void on_child_exit(const MemberId& member, int code, int signal);

  // A replacement the launcher started as `member` (a new incarnation of a dead worker's slot)
  // on local slot `local_rank`: once it asks (`elastic/join/<member>` = its pid, written when
  // it is ready to enter), the next poll feeds the Keeper its JoinRequest. The launcher spawned
  // it, so it is admitted without a secret or fingerprint check (§6.3 is for --join).
  void expect_joiner(const MemberId& member, int local_rank);

  // An addition the launcher started as `member` will never join (the provider could not start
  // it, its job pended too long, or it ended first): it is no longer expected, and the policy's
  // pending decision fails (AutoscalePolicy::proposal_failed at the last progress step: a
  // cooldown, as after a removal). Returns false, and does nothing, when `member` is not
  // expected any more (it joined, or was given up before).
  bool addition_failed(const MemberId& member);

  // The autoscale decision the last polls made, if any (once).
  std::optional<ScaleDecision> take_scale_decision();
  const AutoscalePolicy* autoscale() const { return autoscale_ ? &*autoscale_ : nullptr; }

  // Reads the store, decides, publishes. Returns the record published, if any.
  std::optional<GenerationRecord> poll(Instant now);

  const GenerationRecord& current() const { return keeper_.current(); }
  bool stopped() const { return keeper_.stopped(); }
  const LocalKeeperOptions& options() const { return options_; }

  // The store file of generation g: the control file for 0, else store_dir/g<g>.store.
  std::string store_file(int64_t generation) const;

 private:
  void open_generation();  // heartbeat client for current()'s group
  void unlink_retired(Instant now);
  bool read_heartbeats(Instant now, std::vector<Event>* events);  // false: store unreadable
  void read_progress(std::vector<Event>* events);
  void read_requests(std::vector<Event>* events);     // suspect reports and leave requests
  void read_other_nodes(std::vector<Event>* events);  // node_requests.h
  bool tcp() const { return options_.control.file.empty() || !options_.groups.host.empty(); }
  void after_publish(const GenerationRecord& record, Instant now);

  LocalKeeperOptions options_;
  Keeper keeper_;
  comm::StorePtr control_;  // the job's store under the secret's prefix
  comm::StorePtr group_;    // the current generation's store under its "g<g>/" prefix
  int64_t group_generation_ = -1;
  int64_t generation_start_ms_ = 0;    // steady clock, when current() began
  std::map<MemberId, int64_t> beats_;  // last beat seen per member of current()
  std::map<MemberId, std::string> suspect_text_;
  std::set<MemberId> leaving_;       // leave requests already fed
  std::map<MemberId, int> joiners_;  // replacements expected to ask, with their local slot
  int64_t progress_ = -1;
  std::optional<AutoscalePolicy> autoscale_;
  std::optional<ScaleDecision> scale_;
  std::vector<Event> exits_;
  std::vector<std::pair<std::string, int64_t>> retired_;  // store file, when it was replaced
  std::set<MemberId> exit_read_;                          // members whose reported exit was fed
  int64_t announce_cursor_ = 0;
  int64_t admit_cursor_ = 0;
  int next_node_ = 0;  // the node number the next admitted machine gets
};

// The launcher's line for a change (no "krab: " prefix, no newline), e.g.
// "generation 1: lost rank 2 (member 0.2.0: killed by signal 9); 3 workers go on". Names the
// generation, each lost member with its rank in `before` and its cause, and the new count;
// for a record below min_workers "...; 1 worker left, below elastic.min_workers 2: waiting up
// to elastic.wait_s 60 s for more"; for state stop the line says the run stops.
std::string describe_change(const GenerationRecord& before, const GenerationRecord& after,
                            const KeeperOptions& options);

// RUN_DIR/autoscale.json's text: {"workers", "settled", "sizes": [{workers, step, median_step_s,
// rate}], "decisions": [{action, step, from, to, rate, rate_below, efficiency, reason}]}.
std::string autoscale_json(const AutoscalePolicy& policy);

// RUN_DIR/workers.json's text: {"generation": g, "workers": [{"rank": r, "member": "n.s.i",
// "pid": p}, ...]} in rank order, one line, ending in '\n'.
std::string workers_json(const GenerationRecord& record);

}  // namespace krab::elastic
