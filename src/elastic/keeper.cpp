#include "elastic/keeper.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"

namespace krab::elastic {

// What one batch of events found. Nothing is decided while events are applied, so the order of
// events within a batch changes only the order of `lost` and `reasons`, never which record
// follows (except that a join is checked against max_workers when it arrives).
struct Keeper::Change {
  std::vector<LostMember> lost;
  std::vector<Member> joiners;
  std::vector<std::string> reasons;  // in order of first appearance, each once
  bool abort = false;
  bool group_error = false;
  bool stop = false;

  bool has_lost(const MemberId& id) const {
    return std::any_of(lost.begin(), lost.end(), [&](const LostMember& l) { return l.id == id; });
  }
  void reason(const std::string& word) {
    if (std::find(reasons.begin(), reasons.end(), word) == reasons.end()) reasons.push_back(word);
  }
  void lose(const MemberId& id, std::string cause, const std::string& word, bool failure) {
    if (has_lost(id)) return;
    lost.push_back({id, std::move(cause)});
    reason(word);
    abort = abort || failure;
  }
  bool empty() const { return lost.empty() && joiners.empty() && !group_error && !stop; }
};

namespace {

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

void check_options(const KeeperOptions& o) {
  KRAB_CHECK_ARG(o.min_workers >= 1, "elastic.min_workers ", o.min_workers, " must be >= 1");
  KRAB_CHECK_ARG(o.max_workers >= 0, "elastic.max_workers ", o.max_workers,
                 " must be >= 0 (0: parallel.workers)");
  KRAB_CHECK_ARG(o.max_workers == 0 || o.max_workers >= o.min_workers, "elastic.min_workers ",
                 o.min_workers, " > elastic.max_workers ", o.max_workers);
  KRAB_CHECK_ARG(o.heartbeat_ms > 0, "elastic.heartbeat_ms ", o.heartbeat_ms, " must be > 0");
  KRAB_CHECK_ARG(o.dead_after_ms > 0, "elastic.dead_after_ms ", o.dead_after_ms, " must be > 0");
  KRAB_CHECK_ARG(std::isfinite(o.wait_s) && o.wait_s >= 0 && o.wait_s <= 1e9, "elastic.wait_s ",
                 o.wait_s, " must be a number of seconds >= 0");
}

}  // namespace

Keeper::Keeper(const KeeperOptions& options, std::vector<Member> initial, StoreNamer store_for,
               Instant now)
    : options_(options), store_for_(std::move(store_for)) {
  check_options(options_);
  max_workers_ = options_.max_workers > 0 ? options_.max_workers
                                          : std::max(1, static_cast<int>(initial.size()));
  KRAB_CHECK_ARG(static_cast<int>(initial.size()) <= max_workers_, initial.size(),
                 " workers at the start exceed elastic.max_workers ", max_workers_);
  KRAB_CHECK_ARG(
      options_.max_workers > 0 || static_cast<int>(initial.size()) >= options_.min_workers,
      "elastic.min_workers ", options_.min_workers, " > elastic.max_workers ", max_workers_,
      " (0: the ", initial.size(), " workers at the start)");
  for (size_t r = 0; r < initial.size(); ++r) {
    initial[r].rank = static_cast<int>(r);
    KRAB_CHECK_ARG(used_.insert(initial[r].id).second, "member id ", initial[r].id.str(),
                   " given twice");
    watch_[initial[r].id] = Watch{now.steady_ms, false};
  }
  current_.generation = 0;
  current_.members = std::move(initial);
  current_.store = store_for_(0);
  current_.reason = "start";
  current_.decided_at_ms = now.unix_ms;
  if (current_.workers() < options_.min_workers) {
    current_.state = RecordState::kWaiting;
    waiting_since_ms_ = now.steady_ms;
  }
}

Keeper::Keeper(const KeeperOptions& options, const GenerationRecord& current, StoreNamer store_for,
               Instant now)
    : options_(options), max_workers_(options.max_workers), store_for_(std::move(store_for)) {
  check_options(options_);
  KRAB_CHECK_ARG(max_workers_ > 0, "a keeper that takes over needs elastic.max_workers resolved");
  current_ = current;
  newest_step_ = current.decided_step;
  for (const Member& m : current_.members) {
    used_.insert(m.id);
    watch_[m.id] = Watch{now.steady_ms, false};
  }
  if (current_.state == RecordState::kWaiting) waiting_since_ms_ = now.steady_ms;
}

std::optional<GenerationRecord> Keeper::relocate(const std::vector<int>& dead_nodes, Instant now) {
  if (stopped()) return std::nullopt;
  Change change;
  for (int node : dead_nodes) apply(event::LeaseExpired{node}, now, &change);
  change.group_error = true;
  change.abort = true;
  change.reason("leader");
  return decide(change, now);
}

std::vector<Refusal> Keeper::take_refusals() {
  std::vector<Refusal> out;
  out.swap(refusals_);
  return out;
}

std::optional<GenerationRecord> Keeper::on_events(const std::vector<Event>& events, Instant now) {
  Change change;
  for (const auto& e : events) apply(e, now, &change);
  if (stopped()) return std::nullopt;
  return decide(change, now);
}

void Keeper::apply(const Event& event, Instant now, Change* change) {
  if (stopped()) {
    // A stopped run takes no one: say so to a joiner instead of leaving it waiting.
    if (const auto* join = std::get_if<event::JoinRequest>(&event))
      refusals_.push_back(
          {join->member, str_cat("the run stopped at generation ", current_.generation,
                                 " (below elastic.min_workers ", options_.min_workers, ")")});
    return;
  }
  if (const auto* e = std::get_if<event::ChildExited>(&event)) {
    on_exit(*e, change);
  } else if (const auto* e = std::get_if<event::Heartbeat>(&event)) {
    auto it = watch_.find(e->member);
    if (it != watch_.end())
      it->second.last_beat_ms = std::max(it->second.last_beat_ms, now.steady_ms);
  } else if (std::holds_alternative<event::HeartbeatTick>(event)) {
    on_heartbeat_tick(now, change);
  } else if (const auto* e = std::get_if<event::Suspect>(&event)) {
    on_suspect(*e, now, change);
  } else if (const auto* e = std::get_if<event::LeaveRequest>(&event)) {
    if (is_member(e->member)) change->lose(e->member, "left", "leave", /*failure=*/false);
  } else if (const auto* e = std::get_if<event::JoinRequest>(&event)) {
    on_join(*e, change);
  } else if (const auto* e = std::get_if<event::LeaseExpired>(&event)) {
    for (const auto& m : current_.members)
      if (m.node == e->node && !watch_.at(m.id).exited)
        change->lose(m.id, str_cat("lease of node ", e->node, " expired"), "lease", true);
  } else if (const auto* e = std::get_if<event::Progress>(&event)) {
    newest_step_ = std::max(newest_step_, e->step);
  } else if (std::holds_alternative<event::WaitTick>(event)) {
    const int64_t wait_ms = std::llround(options_.wait_s * 1000);
    if (waiting_since_ms_ && now.steady_ms - *waiting_since_ms_ >= wait_ms) change->stop = true;
  }
}

void Keeper::on_exit(const event::ChildExited& e, Change* change) {
  auto it = watch_.find(e.member);
  if (it == watch_.end()) return;  // left by request already, or lost earlier
  if (e.signal == 0 && e.code == 0) {
    // The run ended for it (or it left and its proposal is being written): not a death, and
    // its heartbeats stop now.
    it->second.exited = true;
    return;
  }
  change->lose(e.member,
               e.signal != 0 ? str_cat("killed by signal ", e.signal)
                             : str_cat("exited with status ", e.code),
               "death", /*failure=*/true);
}

void Keeper::on_heartbeat_tick(Instant now, Change* change) {
  for (const auto& m : current_.members) {
    const Watch& w = watch_.at(m.id);
    const int64_t silent = now.steady_ms - w.last_beat_ms;
    if (!w.exited && silent >= options_.dead_after_ms)
      change->lose(m.id, str_cat("no heartbeat for ", silent, " ms"), "freeze", true);
  }
  // A report that found every peer alive: the reporter's group is broken all the same. Give
  // the heartbeats dead_after_ms to name a culprit; if none did and g is still current, rebuild
  // with whoever is alive (at worst the same members).
  if (suspected_at_ms_ && now.steady_ms - *suspected_at_ms_ >= options_.dead_after_ms) {
    change->group_error = true;
    change->abort = true;
    change->reason("group error");
  }
}

void Keeper::on_suspect(const event::Suspect& e, Instant now, Change* change) {
  if (e.generation != current_.generation || !is_member(e.reporter)) return;
  // Three periods without a beat: more than one late beat, less than a freeze. Only the
  // report's evidence (an op failed) justifies deciding before dead_after_ms.
  const int64_t stale_ms = std::min(3 * options_.heartbeat_ms, options_.dead_after_ms);
  bool found = false;
  for (const auto& m : current_.members) {
    if (e.peer && m.id != *e.peer) continue;
    const Watch& w = watch_.at(m.id);
    const int64_t silent = now.steady_ms - w.last_beat_ms;
    if (!w.exited && m.id != e.reporter && silent >= stale_ms) {
      change->lose(
          m.id,
          str_cat("no heartbeat for ", silent, " ms after ", e.reporter.str(), "'s op failed"),
          "suspect", true);
      found = true;
    }
  }
  if (!found && !suspected_at_ms_) suspected_at_ms_ = now.steady_ms;
}

void Keeper::on_join(const event::JoinRequest& e, Change* change) {
  const int after = current_.workers() - static_cast<int>(change->lost.size()) +
                    static_cast<int>(change->joiners.size());
  if (used_.count(e.member)) {
    refusals_.push_back({e.member, str_cat("member id ", e.member.str(),
                                           " was already used in this run (a replacement is a "
                                           "new incarnation)")});
  } else if (after >= max_workers_) {
    refusals_.push_back(
        {e.member, str_cat("elastic.max_workers ", max_workers_, " reached: the run has ", after,
                           " workers (generation ", current_.generation, ")")});
  } else {
    used_.insert(e.member);
    change->joiners.push_back(Member{0, e.member.node, e.local_rank, e.pid, e.member});
    change->reason("join");
  }
}

std::optional<GenerationRecord> Keeper::decide(const Change& change, Instant now) {
  if (change.empty()) return std::nullopt;
  GenerationRecord next;
  next.generation = current_.generation + 1;
  next.decided_step = newest_step_;
  for (const auto& m : current_.members)
    if (!change.has_lost(m.id)) next.members.push_back(m);
  next.members.insert(next.members.end(), change.joiners.begin(), change.joiners.end());
  for (size_t r = 0; r < next.members.size(); ++r) next.members[r].rank = static_cast<int>(r);
  next.store = store_for_(next.generation);
  next.kind = change.abort ? RecordKind::kAbort : RecordKind::kProposal;
  next.lost = change.lost;
  next.decided_at_ms = now.unix_ms;
  auto reasons = change.reasons;
  if (next.workers() >= options_.min_workers) {
    next.state = RecordState::kRun;
  } else if (change.stop) {
    next.state = RecordState::kStop;
    reasons.push_back("stop");
  } else {
    next.state = RecordState::kWaiting;
  }
  if (reasons.empty()) return std::nullopt;  // nothing but a stop check, and nothing to stop
  next.reason = join_words(reasons);
  if (next.state == RecordState::kRun) {
    waiting_since_ms_.reset();
  } else if (!waiting_since_ms_) {
    waiting_since_ms_ = now.steady_ms;  // wait_s counts from the first record below the minimum
  }

  // The new generation's group starts beating afresh: every member's clock starts now, and
  // the reports about g's group are moot.
  std::map<MemberId, Watch> watch;
  for (const auto& m : next.members) {
    const auto it = watch_.find(m.id);
    watch[m.id] = Watch{now.steady_ms, it != watch_.end() && it->second.exited};
  }
  watch_.swap(watch);
  suspected_at_ms_.reset();
  current_ = next;
  return next;
}

}  // namespace krab::elastic
