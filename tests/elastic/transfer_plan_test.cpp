// The state-transfer plan (src/elastic/transfer_plan.h) over the world changes a failure or a
// join makes, checked element by element: every parameter element of every new shard (and
// ward) is received exactly once — the expectation computed from the new layout's shard
// arithmetic (flat position / shard size), not from ShardLayout::pieces — and every move reads
// elements that lie in the old shard it names, from a live process that holds that shard,
// preferring a local copy, then the owner, then the ward holder.
#include "elastic/transfer_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "core/errors.h"

namespace krab::elastic {
namespace {

using engine::ShardLayout;

// Sizes chosen not to divide any world used here: 22, 15 (with a 0-element parameter) and a
// scalar, whose unit is all padding on every rank but one.
std::vector<engine::UnitParams> model() {
  return {{"", {{"a", {7}}, {"b", {3, 5}}}},
          {"blk", {{"c", {11}}, {"d", {0}}, {"e", {2, 2}}}},
          {"tiny", {{"f", {}}}}};
}

struct Change {
  int old_world = 0;
  int new_world = 0;
  std::set<int> dead;  // old ranks gone; the others keep their order as new ranks 0, 1, ...
  bool replicated = true;
  int64_t alignment = 1;
};

// Survivors in old-rank order, then joiners (the keeper appends them), each survivor holding
// its own old shard and, replicated, its ward r − 1 mod W.
std::vector<Holder> holders_for(const Change& c) {
  std::vector<Holder> out;
  for (int r = 0; r < c.old_world; ++r) {
    if (c.dead.count(r)) continue;
    Holder h{static_cast<int>(out.size()), r, {r}};
    const int ward = (r + c.old_world - 1) % c.old_world;
    if (c.replicated && ward != r) h.old_shards.push_back(ward);
    out.push_back(h);
  }
  while (static_cast<int>(out.size()) < c.new_world)
    out.push_back({static_cast<int>(out.size()), -1, {}});
  return out;
}

using Target = std::tuple<int, bool, std::string>;  // (dst, ward, param)

// How many times each element of each parameter must be received: once into the new shard
// that contains its flat position, once more into the ward of that shard's buddy.
std::map<Target, std::vector<int>> expected_receipts(const ShardLayout& layout, bool wards) {
  std::map<Target, std::vector<int>> out;
  const int world = layout.world();
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t shard_size = layout.shard_numel(u);
    for (const auto& p : layout.unit(u).params) {
      for (int64_t e = 0; e < p.numel; ++e) {
        const int owner = static_cast<int>((p.offset + e) / shard_size);
        auto& own = out[{owner, false, p.name}];
        own.resize(static_cast<size_t>(p.numel), 0);
        ++own[e];
        if (!wards || world == 1) continue;
        auto& ward = out[{(owner + 1) % world, true, p.name}];
        ward.resize(static_cast<size_t>(p.numel), 0);
        ++ward[e];
      }
    }
  }
  return out;
}

const Holder& holder(const std::vector<Holder>& holders, int new_rank) {
  for (const Holder& h : holders)
    if (h.new_rank == new_rank) return h;
  throw Error("no holder for new rank");
}

bool holds(const Holder& h, int shard) {
  return std::find(h.old_shards.begin(), h.old_shards.end(), shard) != h.old_shards.end();
}

void expect_valid(const Change& c, const ShardLayout& from, const ShardLayout& to,
                  const std::vector<Holder>& holders, bool wards, const TransferPlan& plan) {
  std::map<Target, std::vector<int>> received;
  for (const Move& m : plan.moves) {
    SCOPED_TRACE(testing::Message() << m.src << "->" << m.dst << " shard " << m.old_shard << " "
                                    << m.param << "[" << m.offset << ", +" << m.count << ")");
    ASSERT_GE(m.count, 1);
    const auto loc = from.locate(m.param);
    ASSERT_TRUE(loc.has_value());
    ASSERT_LE(m.offset + m.count, loc->numel);
    // The elements read lie in the old shard named, which the source holds and is alive.
    const engine::Range old = from.shard(loc->unit, m.old_shard);
    EXPECT_GE(loc->offset + m.offset, old.begin);
    EXPECT_LE(loc->offset + m.offset + m.count, old.end);
    const Holder& src = holder(holders, m.src);
    EXPECT_TRUE(holds(src, m.old_shard));
    EXPECT_EQ(c.dead.count(src.old_rank), 0u);
    // Preference: the destination itself, else the owner, else the ward holder.
    const Holder& dst = holder(holders, m.dst);
    const bool owner_alive = c.dead.count(m.old_shard) == 0;
    if (holds(dst, m.old_shard))
      EXPECT_EQ(m.src, m.dst);
    else if (owner_alive)
      EXPECT_EQ(src.old_rank, m.old_shard);
    else
      EXPECT_EQ(src.old_rank, (m.old_shard + 1) % c.old_world);
    auto& count = received[{m.dst, m.ward, m.param}];
    count.resize(static_cast<size_t>(loc->numel), 0);
    for (int64_t e = m.offset; e < m.offset + m.count; ++e) ++count[e];
  }
  EXPECT_EQ(received, expected_receipts(to, wards));
}

void expect_plans(const Change& c) {
  SCOPED_TRACE(testing::Message() << c.old_world << " -> " << c.new_world << ", dead "
                                  << testing::PrintToString(c.dead) << ", alignment "
                                  << c.alignment);
  const ShardLayout from = engine::plan_layout(model(), c.old_world, c.alignment);
  const ShardLayout to = engine::plan_layout(model(), c.new_world, c.alignment);
  const std::vector<Holder> holders = holders_for(c);
  for (bool wards : {false, true}) {
    const TransferPlan plan = plan_transfer(from, to, holders, wards);
    expect_valid(c, from, to, holders, wards, plan);
    // The same plan from the same holdings listed in any order.
    std::mt19937 rng(static_cast<unsigned>(c.old_world * 10 + c.new_world));
    for (int shuffle = 0; shuffle < 5; ++shuffle) {
      std::vector<Holder> mixed = holders;
      std::shuffle(mixed.begin(), mixed.end(), rng);
      for (Holder& h : mixed) std::shuffle(h.old_shards.begin(), h.old_shards.end(), rng);
      EXPECT_EQ(plan_transfer(from, to, mixed, wards).moves, plan.moves);
    }
  }
}

TEST(TransferPlan, EveryElementHasExactlyOneLiveSourceAcrossWorldChanges) {
  for (int64_t alignment : {1, 4}) {
    expect_plans({4, 3, {2}, true, alignment});
    expect_plans({4, 5, {}, true, alignment});  // a joiner, who holds nothing
    expect_plans({3, 2, {0}, true, alignment});
    expect_plans({2, 1, {1}, true, alignment});
    expect_plans({8, 7, {0}, true, alignment});
    expect_plans({5, 3, {1, 3}, true, alignment});  // two deaths, not adjacent
    expect_plans({4, 4, {}, true, alignment});
    expect_plans({1, 2, {}, true, alignment});   // one rank had no buddy; a joiner gets a ward
    expect_plans({4, 6, {}, false, alignment});  // no wards before, two joiners
  }
}

TEST(TransferPlan, ASameWorldChangeCopiesEverythingLocally) {
  const ShardLayout layout = engine::plan_layout(model(), 4, 1);
  const TransferPlan plan = plan_transfer(layout, layout, holders_for({4, 4, {}}), true);
  ASSERT_FALSE(plan.moves.empty());
  for (const Move& m : plan.moves) EXPECT_EQ(m.src, m.dst) << m.param;
}

TEST(TransferPlan, MovesComeInOneCanonicalOrder) {
  const ShardLayout from = engine::plan_layout(model(), 8, 1);
  const ShardLayout to = engine::plan_layout(model(), 7, 1);
  const auto plan = plan_transfer(from, to, holders_for({8, 7, {0}}), true);
  // By dst, own before ward, then unit, then flat position in the new layout.
  const auto key = [&](const Move& m) {
    const auto loc = to.locate(m.param);
    return std::make_tuple(m.dst, m.ward, loc->unit, loc->offset + m.offset);
  };
  for (size_t k = 1; k < plan.moves.size(); ++k)
    EXPECT_LT(key(plan.moves[k - 1]), key(plan.moves[k])) << k;
}

TEST(TransferPlan, AdjacentDeathsNameTheLostShard) {
  const Change c{4, 2, {1, 2}, true, 1};
  const ShardLayout from = engine::plan_layout(model(), 4, 1);
  const ShardLayout to = engine::plan_layout(model(), 2, 1);
  // Shard 2 survives on rank 3 (its ward holder); shard 1 had copies on ranks 1 and 2 only.
  EXPECT_EQ(lost_shards(from, holders_for(c)), std::vector<int>{1});
  try {
    plan_transfer(from, to, holders_for(c), true);
    FAIL() << "expected PeerLost";
  } catch (const PeerLost& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("old shard 1 of world 4"), std::string::npos) << what;
    EXPECT_NE(what.find("owner was rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
    EXPECT_EQ(what.find("old shard 2"), std::string::npos) << what;
  }
}

TEST(TransferPlan, WithoutReplicasADeathLosesItsShardUnlessTheShardIsPadding) {
  const ShardLayout from = engine::plan_layout(model(), 4, 1);
  EXPECT_EQ(lost_shards(from, holders_for({4, 3, {2}, false})), std::vector<int>{2});
  EXPECT_EQ(lost_shards(from, holders_for({4, 2, {0, 3}, false})), (std::vector<int>{0, 3}));
  // One scalar at W = 4: shards 1-3 are all padding, so losing rank 2 loses nothing.
  const std::vector<engine::UnitParams> scalar = {{"", {{"f", {}}}}};
  const ShardLayout small = engine::plan_layout(scalar, 4, 1);
  const auto holders = holders_for({4, 3, {2}, false});
  EXPECT_TRUE(lost_shards(small, holders).empty());
  const auto plan = plan_transfer(small, engine::plan_layout(scalar, 3, 1), holders, false);
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0], (Move{0, 0, 0, false, "f", 0, 1}));
}

TEST(TransferPlan, RefusesInconsistentHoldingsAndLayouts) {
  const ShardLayout from = engine::plan_layout(model(), 4, 1);
  const ShardLayout to = engine::plan_layout(model(), 3, 1);
  auto holders = holders_for({4, 3, {2}});
  EXPECT_THROW(plan_transfer(from, engine::plan_layout(model(), 4, 1), holders, true),
               InvalidArgument);  // 3 holders for a world of 4
  auto twice = holders;
  twice[1].new_rank = 0;
  EXPECT_THROW(plan_transfer(from, to, twice, true), InvalidArgument);
  auto same_old = holders;
  same_old[1].old_rank = 0;
  EXPECT_THROW(plan_transfer(from, to, same_old, true), InvalidArgument);
  auto joiner = holders;
  joiner[2] = {2, -1, {3}};
  EXPECT_THROW(plan_transfer(from, to, joiner, true), InvalidArgument);
  auto outside = holders;
  outside[0].old_shards.push_back(4);
  EXPECT_THROW(plan_transfer(from, to, outside, true), InvalidArgument);
  const std::vector<engine::UnitParams> other = {{"", {{"a", {8}}, {"b", {3, 5}}}}};
  EXPECT_THROW(plan_transfer(from, engine::plan_layout(other, 3, 1), holders, true),
               InvalidArgument);  // 'a' has 7 elements in the old layout
}

}  // namespace
}  // namespace krab::elastic
