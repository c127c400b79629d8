#include "elastic/local_keeper.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/peer_monitor.h"
#include "core/errors.h"
#include "elastic/membership_view.h"
#include "elastic/node_requests.h"

namespace krab::elastic {

namespace {

// Store calls of the keeper are local file reads; a FileStore's get() waits for an absent key up
// to this, but every read here checks first, so it only bounds a store that went wrong.
constexpr std::chrono::milliseconds kStoreTimeout{5000};

std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// The value of `key` in `store`, or nullopt when it is absent or cannot be read now: the keeper
// polls, so a read that fails is simply tried again.
std::optional<std::string> try_read(c10d::Store& store, const std::string& key) {
  try {
    if (!store.check({key})) return std::nullopt;
    return text_of(store.get(key));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The worker of a generation opens its store file; it must exist before the record naming it
// is published. Made here, 0600 and never through a planted symlink (as comm::StoreServer).
void create_store_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
  KRAB_CHECK_ARG(fd >= 0, "cannot create the generation store file ", path, ": ",
                 std::strerror(errno));
  ::close(fd);
}

std::string workers_word(int n) { return str_cat(n, n == 1 ? " worker" : " workers"); }

}  // namespace

Instant now_instant() {
  using namespace std::chrono;
  return {duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count(),
          duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count()};
}

namespace {

// The record's `store` of generation g: this keeper's TCPStore (etcd), node 0's (c10d across
// machines), or a FileStore file (one machine).
Keeper::StoreNamer store_namer(const LocalKeeperOptions& o) {
  return [control = o.control, groups = o.groups, dir = o.store_dir](int64_t g) {
    if (!groups.host.empty()) return groups.to_string();
    if (control.file.empty()) return control.to_string();
    return g == 0 ? "file " + control.file : str_cat("file ", dir, "/g", g, ".store");
  };
}

comm::StorePtr control_of(const LocalKeeperOptions& o) {
  return o.control_store ? o.control_store : comm::connect_store(o.control, kStoreTimeout);
}

}  // namespace

LocalKeeper::LocalKeeper(LocalKeeperOptions options, std::vector<Member> initial, Instant now)
    : options_(std::move(options)),
      keeper_(options_.keeper, std::move(initial), store_namer(options_), now),
      control_(control_of(options_)),
      generation_start_ms_(now.steady_ms),
      next_node_(options_.nodes) {
  if (options_.autoscale) autoscale_.emplace(*options_.autoscale);
  publish_record(*control_, keeper_.current());
}

LocalKeeper::LocalKeeper(LocalKeeperOptions options, const GenerationRecord& current,
                         const std::vector<int>& dead_nodes, Instant now)
    : options_(std::move(options)),
      keeper_(options_.keeper, current, store_namer(options_), now),
      control_(control_of(options_)),
      generation_start_ms_(now.steady_ms),
      next_node_(options_.nodes) {
  if (options_.autoscale) autoscale_.emplace(*options_.autoscale);
  // Machines admitted by the previous leader keep their numbers: count on from the highest.
  for (const Member& m : current.members) next_node_ = std::max(next_node_, m.node + 1);
  if (const std::optional<GenerationRecord> record = keeper_.relocate(dead_nodes, now))
    after_publish(*record, now);
}

std::string LocalKeeper::store_file(int64_t generation) const {
  return generation == 0 ? options_.control.file
                         : str_cat(options_.store_dir, "/g", generation, ".store");
}

void LocalKeeper::on_child_exit(const MemberId& member, int code, int signal) {
  exits_.push_back(event::ChildExited{member, code, signal});
}

std::optional<GenerationRecord> LocalKeeper::poll(Instant now) {
  // Exits first: a member found dead by its exit is named by its exit status, not by the
  // silence of its heartbeats that follows.
  std::vector<Event> events;
  events.swap(exits_);
  // No heartbeat tick when the generation's store cannot be read: its silence would be ours,
  // not the workers', and would drop (and kill) every one of them.
  const bool heard = read_heartbeats(now, &events);
  read_progress(&events);
  read_requests(&events);
  if (options_.nodes > 1) read_other_nodes(&events);
  if (heard) events.emplace_back(event::HeartbeatTick{});
  events.emplace_back(event::WaitTick{});
  std::optional<GenerationRecord> record = keeper_.on_events(events, now);
  unlink_retired(now);
  if (!record) return std::nullopt;
  after_publish(*record, now);
  return record;
}

void LocalKeeper::after_publish(const GenerationRecord& record, Instant now) {
  if (!tcp()) create_store_file(store_file(record.generation));
  publish_record(*control_, record);
  if (record.generation >= 2 && !tcp())
    retired_.emplace_back(store_file(record.generation - 1), now.steady_ms);
  generation_start_ms_ = now.steady_ms;
}

void LocalKeeper::unlink_retired(Instant now) {
  while (!retired_.empty() &&
         now.steady_ms - retired_.front().second >= options_.start_grace.count()) {
    ::unlink(retired_.front().first.c_str());  // best effort: the directory goes at exit anyway
    retired_.erase(retired_.begin());
  }
}

void LocalKeeper::open_generation() {
  const GenerationRecord& g = keeper_.current();
  comm::Endpoint at = options_.groups.host.empty() ? options_.control : options_.groups;
  if (!tcp()) at.file = store_file(g.generation);
  // The workers' groups key their heartbeats as comm/factory.cpp names the group's prefix.
  group_ = comm::prefixed(str_cat("g", g.generation, "/"), comm::connect_store(at, kStoreTimeout));
  group_generation_ = g.generation;
  beats_.clear();
}

bool LocalKeeper::read_heartbeats(Instant now, std::vector<Event>* events) {
  const GenerationRecord& g = keeper_.current();
  if (group_generation_ != g.generation) {
    try {
      open_generation();
    } catch (const std::exception&) {
      return false;  // its file is made before the record is published; try again next poll
    }
  }
  const auto records = comm::PeerMonitor::read_records(*group_, g.workers());
  const bool starting =
      g.generation == 0 && now.steady_ms - generation_start_ms_ < options_.start_grace.count();
  for (const Member& m : g.members) {
    const auto& r = records[m.rank];
    auto seen = beats_.find(m.id);
    if (r.present && (seen == beats_.end() || seen->second != r.beat)) {
      beats_[m.id] = r.beat;
      events->emplace_back(event::Heartbeat{m.id});
    } else if (!r.present && seen == beats_.end() && starting) {
      events->emplace_back(event::Heartbeat{m.id});  // still starting: see the header
    }
  }
  return true;
}

void LocalKeeper::read_progress(std::vector<Event>* events) {
  const std::optional<std::string> text = try_read(*control_, kProgressKey);
  if (!text) return;
  // "<step>", or "<step> <more>" (§8 plans a Unix time after it): the leading count is ours.
  int64_t step = -1;
  const char* last = text->data() + text->size();
  const auto [end, ec] = std::from_chars(text->data(), last, step);
  if (ec != std::errc() || (end != last && *end != ' ') || step <= progress_) return;
  progress_ = step;
  events->emplace_back(event::Progress{step});
  if (!autoscale_ || end == last) return;
  double unix_s = 0;
  const auto [time_end, time_ec] = std::from_chars(end + 1, last, unix_s);
  if (time_ec != std::errc() || time_end != last) return;
  const int workers = keeper_.current().workers();
  int capacity = std::max(0, keeper_.max_workers() - workers - static_cast<int>(joiners_.size()));
  // The provider is asked only when the room below max_workers would let the policy add: for
  // Slurm it is a client call.
  if (capacity > 0 && options_.capacity) capacity = std::min(capacity, options_.capacity());
  if (auto decision = autoscale_->on_progress(step, unix_s, workers, capacity))
    scale_ = std::move(decision);
}

std::optional<ScaleDecision> LocalKeeper::take_scale_decision() {
  std::optional<ScaleDecision> out = std::move(scale_);
  scale_.reset();
  return out;
}

std::string autoscale_json(const AutoscalePolicy& policy) {
  nlohmann::json sizes = nlohmann::json::array(), decisions = nlohmann::json::array();
  for (const SizeRate& r : policy.measurements())
    sizes.push_back({{"workers", r.workers},
                     {"step", r.step},
                     {"median_step_s", r.median_step_s},
                     {"rate", r.rate}});
  for (const ScaleDecision& d : policy.decisions()) {
    nlohmann::json j = {{"action", to_string(d.action)},
                        {"step", d.step},
                        {"from", d.from},
                        {"to", d.to},
                        {"rate", d.rate},
                        {"reason", d.reason}};
    if (d.rate_below) j["rate_below"] = *d.rate_below;
    if (d.efficiency) j["efficiency"] = *d.efficiency;
    decisions.push_back(std::move(j));
  }
  return nlohmann::json({{"workers", policy.workers()},
                         {"settled", policy.settled()},
                         {"sizes", sizes},
                         {"decisions", decisions}})
             .dump(1) +
         "\n";
}

void LocalKeeper::expect_joiner(const MemberId& member, int local_rank) {
  joiners_[member] = local_rank;
}

bool LocalKeeper::addition_failed(const MemberId& member) {
  if (joiners_.erase(member) == 0) return false;
  if (autoscale_) autoscale_->proposal_failed(std::max<int64_t>(progress_, 0));
  return true;
}

// The other machines' launchers (node_requests.h): their workers' exits, the joiners they
// started (then expected like the launcher's own replacements), and machines asking to join.
void LocalKeeper::read_other_nodes(std::vector<Event>* events) {
  try {
    for (const Member& m : keeper_.current().members) {
      if (exit_read_.count(m.id)) continue;
      if (const std::optional<ReportedExit> e = read_exit(*control_, m.id)) {
        exit_read_.insert(m.id);
        events->emplace_back(event::ChildExited{m.id, e->code, e->signal});
      }
    }
    for (const Announcement& a : read_announcements(*control_, &announce_cursor_))
      expect_joiner(a.member, a.local_rank);
    for (const AdmissionRequest& r : read_admissions(*control_, &admit_cursor_)) {
      const std::string why = options_.admit ? options_.admit(r.fingerprint, next_node_)
                                             : std::string("this run admits no machine (--join)");
      answer_admission(*control_, r.index, why.empty() ? next_node_ : -1, why);
      if (why.empty()) ++next_node_;
    }
  } catch (const std::exception&) {  // a read that fails now is tried again at the next poll
  }
}

void LocalKeeper::read_requests(std::vector<Event>* events) {
  // A FileStore cannot list keys: the joiners' keys are the ones the launcher expects.
  for (auto it = joiners_.begin(); it != joiners_.end();) {
    const std::optional<std::string> pid =
        try_read(*control_, str_cat(kJoinPrefix, it->first.str()));
    if (!pid) {
      ++it;
      continue;
    }
    event::JoinRequest join{it->first, it->second, 0};
    try {
      join.pid = std::stoll(*pid);
    } catch (const std::exception&) {  // informational only: the record's pid is 0 then
    }
    events->emplace_back(join);
    it = joiners_.erase(it);
  }
  for (const Member& m : keeper_.current().members) {
    // A graceful leave (§2.4): asked once; the Keeper proposes the generation without it.
    if (!leaving_.count(m.id) && try_read(*control_, str_cat(kLeavePrefix, m.id.str()))) {
      leaving_.insert(m.id);
      events->emplace_back(event::LeaveRequest{m.id});
    }
    const std::optional<std::string> text =
        try_read(*control_, str_cat("elastic/suspect/", m.id.str()));
    if (!text || suspect_text_[m.id] == *text) continue;
    suspect_text_[m.id] = *text;
    // "<generation> <peer member id or ->"; anything else is not a report (reports are hints:
    // heartbeats and exits decide without them).
    std::istringstream in(*text);
    int64_t generation = -1;
    std::string peer;
    if (!(in >> generation >> peer) || generation < 0) continue;
    event::Suspect s{m.id, std::nullopt, generation};
    if (peer != "-") {
      try {
        s.peer = MemberId::parse(peer);
      } catch (const std::exception&) {
        continue;
      }
    }
    events->emplace_back(s);
  }
}

std::string describe_change(const GenerationRecord& before, const GenerationRecord& after,
                            const KeeperOptions& options) {
  std::string lost;
  for (const LostMember& l : after.lost) {
    std::string rank = "a member";
    for (const Member& m : before.members)
      if (m.id == l.id) rank = str_cat("rank ", m.rank);
    lost +=
        str_cat(lost.empty() ? "lost " : ", ", rank, " (member ", l.id.str(), ": ", l.cause, ")");
  }
  std::string joined;
  for (const Member& m : after.members) {
    bool old = false;
    for (const Member& b : before.members) old = old || b.id == m.id;
    if (!old)
      joined +=
          str_cat(joined.empty() ? "" : ", ", "member ", m.id.str(), " joined as rank ", m.rank);
  }
  std::string what = lost;
  if (!joined.empty()) what += str_cat(what.empty() ? "" : "; ", joined);
  if (what.empty()) what = str_cat(after.reason, " (the same members)");
  const int n = after.workers();
  switch (after.state) {
    case RecordState::kRun:
      return str_cat("generation ", after.generation, ": ", what, "; ", workers_word(n), " go",
                     n == 1 ? "es" : "", " on");
    case RecordState::kWaiting:
      return str_cat("generation ", after.generation, ": ", what, "; ", workers_word(n),
                     " left, below elastic.min_workers ", options.min_workers,
                     ": waiting up to elastic.wait_s ", options.wait_s, " s for more");
    default:
      return str_cat("generation ", after.generation, ": ", workers_word(n),
                     " left after waiting elastic.wait_s ", options.wait_s,
                     " s, below elastic.min_workers ", options.min_workers, ": the run stops");
  }
}

std::string workers_json(const GenerationRecord& record) {
  std::string out = str_cat("{\"generation\": ", record.generation, ", \"workers\": [");
  for (const Member& m : record.members)
    out += str_cat(m.rank == 0 ? "" : ", ", "{\"rank\": ", m.rank, ", \"member\": \"", m.id.str(),
                   "\", \"pid\": ", m.pid, "}");
  return out + "]}\n";
}

}  // namespace krab::elastic
