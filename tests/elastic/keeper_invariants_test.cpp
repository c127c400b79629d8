// Every sequence of up to four steps over an alphabet of eleven (deaths, freezes, suspect
// reports, joins — new and reused ids —, leaves, exits of 0, wait ticks), run on a keeper of three
// workers with min_workers 2 and max_workers 4: 16,104 sequences. After every step the record
// the keeper returned (if any) is checked against invariants derived from the design (§1.1,
// §1.2, §2.3-§2.5), not from the keeper's code:
//   - generation numbers are consecutive from 1 and never repeat; nothing follows a stop;
//   - every record encodes and decodes to itself (it can be written to the store);
//   - the members of g+1 are g's survivors in their old rank order, then joiners; ranks dense;
//   - every member of g is either a member of g+1 or in its `lost`; no lost id is a member;
//   - a joiner's id was never a member before (ids are never reused);
//   - W <= max_workers; state run iff W >= min_workers, otherwise waiting or stop, and stop
//     only after waiting;
//   - kind abort iff a member was lost by failure (any cause but "left") or a group error;
//   - a record with no change of members is only a group error or a state change.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "elastic/keeper.h"

namespace krab::elastic {
namespace {

struct Step {
  const char* name;
  int64_t advance_ms;
  std::function<std::vector<Event>(const GenerationRecord&, int* next_join)> events;
};

const std::vector<Step>& alphabet() {
  static const std::vector<Step> steps = {
      {"kill rank 0", 10,
       [](const GenerationRecord& g, int*) -> std::vector<Event> {
         if (g.members.empty()) return {};
         return {event::ChildExited{g.members.front().id, 0, 9}};
       }},
      {"kill last rank", 10,
       [](const GenerationRecord& g, int*) -> std::vector<Event> {
         if (g.members.empty()) return {};
         return {event::ChildExited{g.members.back().id, 1, 0}};
       }},
      {"rank 0 exits 0", 10,
       [](const GenerationRecord& g, int*) -> std::vector<Event> {
         if (g.members.empty()) return {};
         return {event::ChildExited{g.members.front().id, 0, 0}};
       }},
      {"rank 0 leaves", 10,
       [](const GenerationRecord& g, int*) -> std::vector<Event> {
         if (g.members.empty()) return {};
         return {event::LeaveRequest{g.members.front().id}};
       }},
      {"rank 0 suspects the last", 700,
       [](const GenerationRecord& g, int*) -> std::vector<Event> {
         if (g.members.empty()) return {};
         return {event::Suspect{g.members.front().id, g.members.back().id, g.generation}};
       }},
      {"a new joiner", 10,
       [](const GenerationRecord&, int* next) -> std::vector<Event> {
         return {event::JoinRequest{{2, (*next)++, 0}, 0, 1}};
       }},
      {"0.0.0 rejoins", 10,
       [](const GenerationRecord&, int*) -> std::vector<Event> {
         return {event::JoinRequest{{0, 0, 0}, 0, 1}};
       }},
      {"all beat", 600,
       [](const GenerationRecord& g, int*) {
         std::vector<Event> out;
         for (const auto& m : g.members) out.push_back(event::Heartbeat{m.id});
         return out;
       }},
      {"all but rank 0 beat, tick", 1100,
       [](const GenerationRecord& g, int*) {
         std::vector<Event> out;
         for (size_t r = 1; r < g.members.size(); ++r)
           out.push_back(event::Heartbeat{g.members[r].id});
         out.push_back(event::HeartbeatTick{});
         return out;
       }},
      {"silence, tick", 1100,
       [](const GenerationRecord&, int*) -> std::vector<Event> {
         return {event::HeartbeatTick{}};
       }},
      {"wait tick", 2100,
       [](const GenerationRecord&, int*) -> std::vector<Event> { return {event::WaitTick{}}; }},
  };
  return steps;
}

bool contains(const std::vector<Member>& members, const MemberId& id) {
  for (const auto& m : members)
    if (m.id == id) return true;
  return false;
}

// The invariants of the file comment, for one returned record `next` after `prev`.
void check_record(const GenerationRecord& prev, const GenerationRecord& next,
                  const std::set<MemberId>& ever, const KeeperOptions& o, int max_workers) {
  ASSERT_EQ(next.generation, prev.generation + 1);
  ASSERT_NE(prev.state, RecordState::kStop);
  ASSERT_EQ(decode(encode(next)), next);
  ASSERT_LE(next.workers(), max_workers);
  for (int r = 0; r < next.workers(); ++r) ASSERT_EQ(next.members[r].rank, r);
  // Survivors first, in the old order; then joiners, never seen before.
  size_t kept = 0;
  for (const auto& m : prev.members) {
    if (!contains(next.members, m.id)) continue;
    ASSERT_LT(kept, next.members.size());
    ASSERT_EQ(next.members[kept].id, m.id);
    ++kept;
  }
  for (size_t j = kept; j < next.members.size(); ++j) ASSERT_EQ(ever.count(next.members[j].id), 0u);
  // Each member of g is kept or lost, and only members of g are lost.
  ASSERT_EQ(kept + next.lost.size(), prev.members.size());
  bool failure = false;
  for (const auto& l : next.lost) {
    ASSERT_TRUE(contains(prev.members, l.id));
    ASSERT_FALSE(contains(next.members, l.id));
    failure = failure || l.cause != "left";
  }
  const bool group_error = next.reason.find("group error") != std::string::npos;
  ASSERT_EQ(next.kind == RecordKind::kAbort, failure || group_error) << next.reason;
  if (next.workers() >= o.min_workers) {
    ASSERT_EQ(next.state, RecordState::kRun);
  } else {
    ASSERT_TRUE(next.state == RecordState::kWaiting || next.state == RecordState::kStop);
    if (next.state == RecordState::kStop) {
      ASSERT_EQ(prev.state, RecordState::kWaiting);
    }
  }
  const bool same_members = next.lost.empty() && kept == next.members.size();
  if (same_members) {
    ASSERT_TRUE(group_error || next.state != prev.state) << next.reason;
  }
}

// One path of the enumeration: the keeper after a prefix of steps, and what the test tracks.
struct Path {
  Keeper keeper;
  std::set<MemberId> ever;  // every id that was a member on this path
  int64_t t = 0;
  int next_join = 0;
  std::string trace;
};

class KeeperInvariants : public ::testing::Test {
 protected:
  // Extends `path` by every step of the alphabet, checks, and recurses to `depth` steps: each
  // prefix is run once, and each sequence of length <= depth is visited.
  void explore(const Path& path, int depth) {
    if (depth == 0 || HasFatalFailure()) return;
    for (const auto& step : alphabet()) {
      Path next = path;
      next.trace += std::string(step.name) + "; ";
      next.t += step.advance_ms;
      const GenerationRecord prev = next.keeper.current();
      const auto events = step.events(prev, &next.next_join);
      const auto record = next.keeper.on_events(events, {next.t, 1765000000000 + next.t});
      ++sequences_;
      SCOPED_TRACE(next.trace);
      if (record) {
        ++records_;
        seen_.insert(std::string(kind_name(record->kind)));
        seen_.insert(std::string(state_name(record->state)));
        for (const char* word : {"death", "freeze", "suspect", "group error", "leave", "join"})
          if (record->reason.find(word) != std::string::npos) seen_.insert(word);
        check_record(prev, *record, next.ever, options_, next.keeper.max_workers());
        ASSERT_EQ(next.keeper.current(), *record);
        for (const auto& m : record->members) next.ever.insert(m.id);
      } else {
        ASSERT_EQ(next.keeper.current(), prev);
      }
      if (HasFatalFailure()) return;
      explore(next, depth - 1);
    }
  }

  KeeperOptions options_;
  size_t sequences_ = 0;
  size_t records_ = 0;
  std::set<std::string> seen_;  // kinds, states and reasons of the records returned
};

TEST_F(KeeperInvariants, EverySequenceOfFourStepsKeepsTheRecordInvariants) {
  options_.min_workers = 2;
  options_.max_workers = 4;
  options_.heartbeat_ms = 100;
  options_.dead_after_ms = 1000;
  options_.wait_s = 2;
  std::vector<Member> initial;
  for (int i = 0; i < 3; ++i) initial.push_back({i, 0, i, 10 + i, {0, i, 0}});
  Path root{Keeper(options_, initial,
                   [](int64_t g) { return "file /r/g" + std::to_string(g) + ".store"; }, {0, 0}),
            {{0, 0, 0}, {0, 1, 0}, {0, 2, 0}},
            0,
            0,
            ""};
  explore(root, 4);
  const size_t n = alphabet().size();
  EXPECT_EQ(sequences_, n + n * n + n * n * n + n * n * n * n);
  // The alphabet reaches every kind of decision, so the invariants were checked on each.
  EXPECT_EQ(seen_, (std::set<std::string>{"abort", "proposal", "run", "waiting", "stop", "death",
                                          "freeze", "suspect", "group error", "leave", "join"}));
  EXPECT_GT(records_, sequences_ / 4);
}

}  // namespace
}  // namespace krab::elastic
