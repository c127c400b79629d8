// The keeper's decisions (elastic/keeper.h), by synthetic events and a fake clock: deaths by
// exit, freezes at the dead_after_ms boundary, suspect reports, joins, leaves, waiting below
// min_workers and the stop after wait_s; then every short event sequence over a small alphabet,
// checked against the invariants of generation records.
#include "elastic/keeper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/errors.h"

namespace krab::elastic {
namespace {

constexpr int64_t kUnix0 = 1765000000000;  // the fake wall clock at steady time 0

Instant at(int64_t ms) { return {ms, kUnix0 + ms}; }

MemberId id(int node, int slot, int incarnation = 0) { return {node, slot, incarnation}; }

// n workers on node 0 (slots 0..n-1), then m on node 1.
std::vector<Member> workers(int n, int m = 0) {
  std::vector<Member> out;
  for (int i = 0; i < n + m; ++i) {
    const int node = i < n ? 0 : 1;
    const int slot = i < n ? i : i - n;
    out.push_back({0, node, slot, 100 + i, id(node, slot)});
  }
  return out;
}

std::string store_for(int64_t g) { return "file /run/g" + std::to_string(g) + ".store"; }

Keeper make(const KeeperOptions& o, std::vector<Member> initial) {
  return Keeper(o, std::move(initial), store_for, at(0));
}

std::vector<MemberId> ids(const GenerationRecord& r) {
  std::vector<MemberId> out;
  for (const auto& m : r.members) out.push_back(m.id);
  return out;
}

// Every member of `k`'s current generation beats at `t`.
void beat_all(Keeper& k, int64_t t) {
  std::vector<Event> beats;
  for (const auto& m : k.current().members) beats.push_back(event::Heartbeat{m.id});
  EXPECT_FALSE(k.on_events(beats, at(t)));
}

void expect_ranks_dense(const GenerationRecord& r) {
  for (int i = 0; i < r.workers(); ++i) EXPECT_EQ(r.members[i].rank, i);
}

TEST(Keeper, StartsAtGenerationZero) {
  Keeper k = make({}, workers(3));
  const auto& g0 = k.current();
  EXPECT_EQ(g0.generation, 0);
  EXPECT_EQ(ids(g0), (std::vector<MemberId>{id(0, 0), id(0, 1), id(0, 2)}));
  expect_ranks_dense(g0);
  EXPECT_EQ(g0.reason, "start");
  EXPECT_EQ(g0.state, RecordState::kRun);
  EXPECT_EQ(g0.store, "file /run/g0.store");
  EXPECT_EQ(g0.decided_at_ms, kUnix0);
  EXPECT_EQ(decode(encode(g0)), g0);
  EXPECT_EQ(k.max_workers(), 3);  // 0 resolves to the initial size
}

TEST(Keeper, DeathByExitIsAnAbortWithoutTheMember) {
  Keeper k = make({}, workers(4));
  const auto g1 = k.on_event(event::ChildExited{id(0, 1), 0, 9}, at(500));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->generation, 1);
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 2), id(0, 3)}));
  expect_ranks_dense(*g1);
  EXPECT_EQ(g1->members[1].pid, 102);  // the survivor's own line, re-ranked
  EXPECT_EQ(g1->lost, (std::vector<LostMember>{{id(0, 1), "killed by signal 9"}}));
  EXPECT_EQ(g1->reason, "death");
  EXPECT_EQ(g1->state, RecordState::kRun);
  EXPECT_EQ(g1->store, "file /run/g1.store");
  EXPECT_EQ(g1->decided_at_ms, kUnix0 + 500);
  EXPECT_EQ(k.current(), *g1);

  const auto g2 = k.on_event(event::ChildExited{id(0, 3), 1, 0}, at(600));
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->lost, (std::vector<LostMember>{{id(0, 3), "exited with status 1"}}));
  // An exit of a member already gone changes nothing.
  EXPECT_FALSE(k.on_event(event::ChildExited{id(0, 1), 0, 9}, at(700)));
}

TEST(Keeper, ExitZeroIsTheEndOfARunNotADeath) {
  Keeper k = make({}, workers(2));
  EXPECT_FALSE(k.on_event(event::ChildExited{id(0, 1), 0, 0}, at(100)));
  // Its heartbeats stop; it is not taken for frozen.
  beat_all(k, 2000);
  EXPECT_FALSE(k.on_event(event::HeartbeatTick{}, at(3100)));
  EXPECT_EQ(k.current().generation, 0);
}

TEST(Keeper, FreezeIsExactlyDeadAfterWithoutABeat) {
  KeeperOptions o;
  o.dead_after_ms = 3000;
  Keeper k = make(o, workers(3));
  beat_all(k, 1000);
  for (int64_t t : {2000, 3000, 3999}) {
    EXPECT_FALSE(k.on_events({event::Heartbeat{id(0, 0)}, event::Heartbeat{id(0, 2)}}, at(t)));
    EXPECT_FALSE(k.on_event(event::HeartbeatTick{}, at(t))) << t;  // 0.1.0 silent 2999 ms at most
  }
  const auto g1 = k.on_event(event::HeartbeatTick{}, at(4000));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(g1->reason, "freeze");
  EXPECT_EQ(g1->lost, (std::vector<LostMember>{{id(0, 1), "no heartbeat for 3000 ms"}}));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 2)}));
}

TEST(Keeper, AMemberThatNeverBeatsIsLostDeadAfterItsGenerationBegan) {
  Keeper k = make({}, workers(2));
  k.on_event(event::Heartbeat{id(0, 0)}, at(2500));
  EXPECT_FALSE(k.on_event(event::HeartbeatTick{}, at(2999)));
  const auto g1 = k.on_event(event::HeartbeatTick{}, at(3000));
  ASSERT_TRUE(g1);
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0)}));
  // The survivor's clock restarted at the decision: its beat at 2500 belonged to g0's group.
  EXPECT_FALSE(k.on_event(event::HeartbeatTick{}, at(5999)));
  EXPECT_TRUE(k.on_event(event::HeartbeatTick{}, at(6000)));
}

// §6.4 on one machine: a worker cut off stops beating and is dropped; when its link returns, its
// old id's beats change nothing (it is no longer a member), and it comes back only as a joiner
// with a new incarnation.
TEST(Keeper, APartitionedWorkerIsDroppedAndRejoinsAsANewIncarnation) {
  Keeper k = make({}, workers(3));
  beat_all(k, 1000);
  k.on_events({event::Heartbeat{id(0, 0)}, event::Heartbeat{id(0, 1)}}, at(3900));
  const auto g1 = k.on_event(event::HeartbeatTick{}, at(4000));
  ASSERT_TRUE(g1);
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 1)}));
  EXPECT_FALSE(k.on_event(event::Heartbeat{id(0, 2)}, at(9000)));
  EXPECT_FALSE(k.on_event(event::JoinRequest{id(0, 2), 2, 102}, at(9000)));
  EXPECT_EQ(k.take_refusals().size(), 1u);
  const auto g2 = k.on_event(event::JoinRequest{id(0, 2, 1), 2, 102}, at(9100));
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->kind, RecordKind::kProposal);
  EXPECT_EQ(ids(*g2), (std::vector<MemberId>{id(0, 0), id(0, 1), id(0, 2, 1)}));
}

TEST(Keeper, SuspectOfALivePeerChangesNothingNow) {
  KeeperOptions o;  // heartbeat_ms 200: stale after 600 ms
  Keeper k = make(o, workers(3));
  beat_all(k, 1000);
  // A single late beat (one period and a bit) is not a death; neither is 599 ms of silence.
  EXPECT_FALSE(k.on_event(event::Suspect{id(0, 0), id(0, 2), 0}, at(1300)));
  EXPECT_FALSE(k.on_event(event::Suspect{id(0, 0), id(0, 2), 0}, at(1599)));
  EXPECT_EQ(k.current().generation, 0);
}

TEST(Keeper, SuspectOfAStalePeerChangesAtOnce) {
  Keeper k = make({}, workers(3));
  beat_all(k, 1000);
  const auto g1 = k.on_event(event::Suspect{id(0, 0), id(0, 2), 0}, at(1600));
  ASSERT_TRUE(g1);  // long before dead_after_ms (3000)
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(g1->reason, "suspect");
  EXPECT_EQ(
      g1->lost,
      (std::vector<LostMember>{{id(0, 2), "no heartbeat for 600 ms after 0.0.0's op failed"}}));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 1)}));
}

TEST(Keeper, SuspectWithoutANamedPeerChecksEveryMember) {
  Keeper k = make({}, workers(3));
  beat_all(k, 1000);
  k.on_events({event::Heartbeat{id(0, 0)}, event::Heartbeat{id(0, 2)}}, at(1500));
  const auto g1 = k.on_event(event::Suspect{id(0, 0), std::nullopt, 0}, at(1700));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->lost.size(), 1u);
  EXPECT_EQ(g1->lost[0].id, id(0, 1));
  // A report about generation 0 once generation 1 is current is about a group already gone.
  EXPECT_FALSE(k.on_event(event::Suspect{id(0, 0), id(0, 2), 0}, at(5000)));
}

TEST(Keeper, ABrokenGroupWithEveryoneAliveIsRebuiltAfterDeadAfter) {
  Keeper k = make({}, workers(3));
  beat_all(k, 1000);
  EXPECT_FALSE(k.on_event(event::Suspect{id(0, 1), id(0, 2), 0}, at(1100)));
  for (int64_t t = 1200; t < 4100; t += 200) {
    beat_all(k, t);
    EXPECT_FALSE(k.on_event(event::HeartbeatTick{}, at(t))) << t;
    // A later report of the same broken group does not put the deadline off.
    if (t == 2000) {
      EXPECT_FALSE(k.on_event(event::Suspect{id(0, 2), id(0, 1), 0}, at(t)));
    }
  }
  beat_all(k, 4100);
  const auto g1 = k.on_event(event::HeartbeatTick{}, at(4100));  // report + dead_after_ms
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(g1->reason, "group error");
  EXPECT_TRUE(g1->lost.empty());
  EXPECT_EQ(ids(*g1), ids(k.current()));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 1), id(0, 2)}));
  // The report is spent: the next ticks change nothing.
  beat_all(k, 8000);
  EXPECT_FALSE(k.on_event(event::HeartbeatTick{}, at(8000)));
}

TEST(Keeper, AJoinerIsProposedAsTheLastRank) {
  KeeperOptions o;
  o.max_workers = 4;
  Keeper k = make(o, workers(3));
  const auto g1 = k.on_event(event::JoinRequest{id(1, 0), 0, 555}, at(10));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->kind, RecordKind::kProposal);
  EXPECT_EQ(g1->reason, "join");
  EXPECT_TRUE(g1->lost.empty());
  EXPECT_EQ(g1->state, RecordState::kRun);
  ASSERT_EQ(g1->workers(), 4);
  EXPECT_EQ(g1->members[3], (Member{3, 1, 0, 555, id(1, 0)}));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 1), id(0, 2), id(1, 0)}));
}

TEST(Keeper, AGracefulLeaveIsAProposal) {
  Keeper k = make({}, workers(3));
  const auto g1 = k.on_event(event::LeaveRequest{id(0, 0)}, at(10));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->kind, RecordKind::kProposal);
  EXPECT_EQ(g1->reason, "leave");
  EXPECT_EQ(g1->lost, (std::vector<LostMember>{{id(0, 0), "left"}}));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 1), id(0, 2)}));
  expect_ranks_dense(*g1);
  // The leaver exits 0 after the vote; and a second request for it is moot.
  EXPECT_FALSE(k.on_event(event::ChildExited{id(0, 0), 0, 0}, at(20)));
  EXPECT_FALSE(k.on_event(event::LeaveRequest{id(0, 0)}, at(30)));
}

TEST(Keeper, TwoDeathsInOneTickAreOneRecord) {
  Keeper k = make({}, workers(4));
  beat_all(k, 1000);
  k.on_events({event::Heartbeat{id(0, 0)}, event::Heartbeat{id(0, 2)}}, at(3500));
  const auto g1 = k.on_event(event::HeartbeatTick{}, at(4000));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->generation, 1);
  EXPECT_EQ(g1->lost, (std::vector<LostMember>{{id(0, 1), "no heartbeat for 3000 ms"},
                                               {id(0, 3), "no heartbeat for 3000 ms"}}));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 2)}));
  // Two exits reaped in one batch are one record too.
  Keeper k2 = make({}, workers(4));
  const auto h1 = k2.on_events(
      {event::ChildExited{id(0, 3), 0, 9}, event::ChildExited{id(0, 0), 0, 15}}, at(50));
  ASSERT_TRUE(h1);
  EXPECT_EQ(h1->generation, 1);
  EXPECT_EQ(ids(*h1), (std::vector<MemberId>{id(0, 1), id(0, 2)}));
}

TEST(Keeper, TwoDeathsInConsecutiveTicksAreConsecutiveGenerations) {
  Keeper k = make({}, workers(4));
  beat_all(k, 1000);
  k.on_events({event::Heartbeat{id(0, 0)}, event::Heartbeat{id(0, 2)}, event::Heartbeat{id(0, 3)}},
              at(3900));
  const auto g1 = k.on_event(event::HeartbeatTick{}, at(4000));
  ASSERT_TRUE(g1);
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 2), id(0, 3)}));
  const auto g2 = k.on_event(event::ChildExited{id(0, 2), 0, 9}, at(4100));
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->generation, 2);
  EXPECT_EQ(ids(*g2), (std::vector<MemberId>{id(0, 0), id(0, 3)}));
  EXPECT_EQ(g2->lost, (std::vector<LostMember>{{id(0, 2), "killed by signal 9"}}));
}

TEST(Keeper, BelowMinItWaitsAndAJoinInTimeResumes) {
  KeeperOptions o;
  o.min_workers = 3;
  o.max_workers = 4;
  o.wait_s = 2;
  Keeper k = make(o, workers(3));
  const auto g1 = k.on_event(event::ChildExited{id(0, 1), 0, 9}, at(100));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->state, RecordState::kWaiting);
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(g1->workers(), 2);
  EXPECT_FALSE(k.on_event(event::WaitTick{}, at(2099)));
  const auto g2 = k.on_event(event::JoinRequest{id(0, 1, 1), 1, 777}, at(2099));
  ASSERT_TRUE(g2);  // the replacement: slot 1, a new incarnation
  EXPECT_EQ(g2->state, RecordState::kRun);
  EXPECT_EQ(g2->kind, RecordKind::kProposal);
  EXPECT_EQ(ids(*g2), (std::vector<MemberId>{id(0, 0), id(0, 2), id(0, 1, 1)}));
  EXPECT_FALSE(k.on_event(event::WaitTick{}, at(60000)));  // no longer waiting
}

TEST(Keeper, BelowMinForWaitSecondsItStops) {
  KeeperOptions o;
  o.min_workers = 3;
  o.max_workers = 4;
  o.wait_s = 2;
  Keeper k = make(o, workers(4));
  ASSERT_TRUE(k.on_event(event::ChildExited{id(0, 1), 0, 9}, at(50)));  // 3: still running
  const auto g2 = k.on_event(event::ChildExited{id(0, 2), 0, 9}, at(100));
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->state, RecordState::kWaiting);
  // A further loss while waiting: waiting still counts from the first waiting record.
  const auto g3 = k.on_event(event::ChildExited{id(0, 3), 0, 9}, at(1000));
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->state, RecordState::kWaiting);
  EXPECT_FALSE(k.on_event(event::WaitTick{}, at(2099)));
  const auto g4 = k.on_event(event::WaitTick{}, at(2100));
  ASSERT_TRUE(g4);
  EXPECT_EQ(g4->generation, 4);
  EXPECT_EQ(g4->state, RecordState::kStop);
  EXPECT_EQ(g4->reason, "stop");
  EXPECT_EQ(ids(*g4), (std::vector<MemberId>{id(0, 0)}));
  EXPECT_TRUE(g4->lost.empty());
  EXPECT_TRUE(k.stopped());
  // Nothing follows a stop; a joiner is told why.
  EXPECT_FALSE(k.on_event(event::JoinRequest{id(1, 0), 0, 1}, at(2200)));
  EXPECT_FALSE(k.on_event(event::ChildExited{id(0, 0), 0, 9}, at(2300)));
  const auto refusals = k.take_refusals();
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals[0].member, id(1, 0));
  EXPECT_EQ(refusals[0].reason, "the run stopped at generation 4 (below elastic.min_workers 3)");
  EXPECT_EQ(k.current(), *g4);
}

TEST(Keeper, MaxWorkersRefusesAJoinWithAPrintableReason) {
  Keeper k = make({}, workers(4));  // max_workers 0: the 4 at the start
  EXPECT_FALSE(k.on_event(event::JoinRequest{id(1, 0), 0, 9}, at(10)));
  auto refusals = k.take_refusals();
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals[0].member, id(1, 0));
  EXPECT_EQ(refusals[0].reason,
            "elastic.max_workers 4 reached: the run has 4 workers (generation 0)");
  EXPECT_TRUE(k.take_refusals().empty());
  // After a death there is room; a death and a join in one batch make one abort record.
  const auto g1 =
      k.on_events({event::ChildExited{id(0, 3), 0, 9}, event::JoinRequest{id(1, 0), 0, 9}}, at(20));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(g1->reason, "death, join");
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 1), id(0, 2), id(1, 0)}));
  // A member id is never used twice, even when there is room.
  ASSERT_TRUE(k.on_event(event::LeaveRequest{id(0, 0)}, at(30)));
  EXPECT_FALSE(k.on_event(event::JoinRequest{id(0, 3), 3, 9}, at(40)));
  refusals = k.take_refusals();
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals[0].reason,
            "member id 0.3.0 was already used in this run (a replacement is a new incarnation)");
}

TEST(Keeper, AnExpiredLeaseLosesEveryMemberOfItsNode) {
  Keeper k = make({}, workers(2, 2));
  const auto g1 = k.on_event(event::LeaseExpired{1}, at(10));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->kind, RecordKind::kAbort);
  EXPECT_EQ(g1->reason, "lease");
  EXPECT_EQ(g1->lost, (std::vector<LostMember>{{id(1, 0), "lease of node 1 expired"},
                                               {id(1, 1), "lease of node 1 expired"}}));
  EXPECT_EQ(ids(*g1), (std::vector<MemberId>{id(0, 0), id(0, 1)}));
  EXPECT_FALSE(k.on_event(event::LeaseExpired{1}, at(20)));  // nobody left there
}

TEST(Keeper, DecidedStepIsTheNewestProgressSeen) {
  Keeper k = make({}, workers(3));
  k.on_events({event::Progress{40}, event::Progress{41}, event::Progress{39}}, at(5));
  const auto g1 = k.on_event(event::ChildExited{id(0, 2), 0, 9}, at(6));
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->decided_step, 41);
}

TEST(Keeper, RefusesOptionsNamingTheKey) {
  const auto refused = [](KeeperOptions o, int n, const std::string& what) {
    try {
      make(o, workers(n));
      ADD_FAILURE() << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KeeperOptions o;
  o.min_workers = 0;
  refused(o, 2, "elastic.min_workers 0 must be >= 1");
  o = {};
  o.min_workers = 5;
  o.max_workers = 4;
  refused(o, 2, "elastic.min_workers 5 > elastic.max_workers 4");
  o = {};
  o.min_workers = 3;
  refused(o, 2, "elastic.min_workers 3 > elastic.max_workers 2");
  o = {};
  o.max_workers = 2;
  refused(o, 3, "3 workers at the start exceed elastic.max_workers 2");
  o = {};
  o.dead_after_ms = 0;
  refused(o, 2, "elastic.dead_after_ms 0 must be > 0");
  o = {};
  o.heartbeat_ms = -1;
  refused(o, 2, "elastic.heartbeat_ms -1 must be > 0");
  o = {};
  o.wait_s = -1;
  refused(o, 2, "elastic.wait_s -1");
  auto twice = workers(2);
  twice[1].id = twice[0].id;
  EXPECT_THROW(Keeper({}, twice, store_for, at(0)), InvalidArgument);
}

}  // namespace
}  // namespace krab::elastic
