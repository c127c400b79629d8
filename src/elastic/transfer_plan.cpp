#include "elastic/transfer_plan.h"

#include <algorithm>

#include "core/errors.h"

namespace krab::elastic {
namespace {

using engine::ShardLayout;

// holders indexed by new rank, each shard list sorted: the plan then depends on what the
// holders say, never on the order the all-gather or the caller listed them in.
std::vector<Holder> by_new_rank(const ShardLayout& old_layout, const std::vector<Holder>& holders) {
  const int old_world = old_layout.world();
  const int new_world = static_cast<int>(holders.size());
  std::vector<Holder> out(holders.size());
  std::vector<bool> seen(holders.size(), false), old_seen(static_cast<size_t>(old_world), false);
  for (const Holder& h : holders) {
    KRAB_CHECK_ARG(h.new_rank >= 0 && h.new_rank < new_world && !seen[h.new_rank],
                   "transfer plan: new rank ", h.new_rank, " is outside [0, ", new_world,
                   ") or listed twice");
    seen[h.new_rank] = true;
    KRAB_CHECK_ARG(h.old_rank >= -1 && h.old_rank < old_world, "transfer plan: new rank ",
                   h.new_rank, " has old rank ", h.old_rank, ", outside [0, ", old_world, ")");
    KRAB_CHECK_ARG(h.old_rank >= 0 || h.old_shards.empty(), "transfer plan: new rank ", h.new_rank,
                   " is a joiner (no old rank) but says it holds old shards");
    if (h.old_rank >= 0) {
      KRAB_CHECK_ARG(!old_seen[h.old_rank], "transfer plan: old rank ", h.old_rank,
                     " is given to two new ranks");
      old_seen[h.old_rank] = true;
    }
    Holder sorted = h;
    std::sort(sorted.old_shards.begin(), sorted.old_shards.end());
    for (size_t k = 0; k < sorted.old_shards.size(); ++k) {
      const int i = sorted.old_shards[k];
      KRAB_CHECK_ARG(i >= 0 && i < old_world && (k == 0 || sorted.old_shards[k - 1] != i),
                     "transfer plan: new rank ", h.new_rank, " holds old shard ", i,
                     ", outside [0, ", old_world, ") or listed twice");
    }
    out[h.new_rank] = std::move(sorted);
  }
  return out;
}

bool holds(const Holder& h, int shard) {
  return std::binary_search(h.old_shards.begin(), h.old_shards.end(), shard);
}

// For each old shard, its holders in the order a source is picked when the destination does
// not hold it: the owner, then the ward holder, then anyone else, each tie by new rank.
std::vector<std::vector<int>> sources_by_preference(int old_world,
                                                    const std::vector<Holder>& holders) {
  std::vector<std::vector<int>> out(static_cast<size_t>(old_world));
  for (int i = 0; i < old_world; ++i) {
    const auto rank_of = [&](const Holder& h) {
      if (h.old_rank == i) return 0;
      if (h.old_rank == (i + 1) % old_world) return 1;
      return 2;
    };
    for (const Holder& h : holders)
      if (holds(h, i)) out[i].push_back(h.new_rank);
    std::stable_sort(out[i].begin(), out[i].end(),
                     [&](int a, int b) { return rank_of(holders[a]) < rank_of(holders[b]); });
  }
  return out;
}

std::vector<int> lost_in(const ShardLayout& old_layout, const std::vector<Holder>& sorted) {
  std::vector<int> lost;
  for (int i = 0; i < old_layout.world(); ++i) {
    bool held = false, has_elements = false;
    for (const Holder& h : sorted) held = held || holds(h, i);
    for (int u = 0; u < old_layout.num_units() && !has_elements; ++u)
      has_elements = !old_layout.pieces(u, old_layout.shard(u, i)).empty();
    if (!held && has_elements) lost.push_back(i);
  }
  return lost;
}

std::string describe_lost(const std::vector<int>& lost, int old_world) {
  std::string out = "elastic state transfer: no surviving process holds ";
  for (size_t k = 0; k < lost.size(); ++k) {
    const int i = lost[k];
    out += str_cat(
        k == 0 ? "" : "; ", "old shard ", i, " of world ", old_world, " (its owner was rank ", i,
        "; its ward holder, with elastic.replicate_shards, rank ", (i + 1) % old_world, ")");
  }
  return out;
}

// Appends the moves that fill new shard `shard` of every unit into `dst`'s own (ward = false)
// or ward state.
void plan_range(const ShardLayout& old_layout, const ShardLayout& new_layout,
                const std::vector<Holder>& holders, const std::vector<std::vector<int>>& sources,
                int dst, int shard, bool ward, std::vector<Move>& out) {
  for (int u = 0; u < new_layout.num_units(); ++u) {
    for (const engine::Piece& piece : new_layout.pieces(u, new_layout.shard(u, shard))) {
      const engine::ParamSpan& param = new_layout.unit(u).params[piece.param];
      const auto loc = old_layout.locate(param.name);
      KRAB_CHECK_ARG(loc && loc->numel == param.numel, "transfer plan: parameter '", param.name,
                     "' of the new layout is ",
                     loc ? str_cat("of ", loc->numel, " elements") : std::string("missing"),
                     " in the old one (", param.numel, " elements in the new)");
      // The piece's elements sit at old flat [loc->offset + a, + n) of the old unit; cut them
      // where an old shard ends (the old shard size is a multiple of the alignment only, so a
      // piece may span several old shards, and a shard may hold several pieces).
      const int64_t old_shard_numel = old_layout.shard_numel(loc->unit);
      int64_t a = loc->offset + piece.param_offset;
      const int64_t end = a + piece.length;
      while (a < end) {
        const int i = static_cast<int>(a / old_shard_numel);
        const int64_t b = std::min(end, (a / old_shard_numel + 1) * old_shard_numel);
        KRAB_CHECK(!sources[i].empty(), "old shard ", i, " has no holder");
        const int src = holds(holders[dst], i) ? dst : sources[i].front();
        out.push_back({src, dst, i, ward, param.name, a - loc->offset, b - a});
        a = b;
      }
    }
  }
}

}  // namespace

std::vector<int> lost_shards(const ShardLayout& old_layout, const std::vector<Holder>& holders) {
  return lost_in(old_layout, by_new_rank(old_layout, holders));
}

TransferPlan plan_transfer(const ShardLayout& old_layout, const ShardLayout& new_layout,
                           const std::vector<Holder>& holders, bool wards) {
  const int new_world = new_layout.world();
  KRAB_CHECK_ARG(static_cast<int>(holders.size()) == new_world, "transfer plan: ", holders.size(),
                 " holders for a new world of ", new_world);
  const std::vector<Holder> sorted = by_new_rank(old_layout, holders);
  const std::vector<int> lost = lost_in(old_layout, sorted);
  if (!lost.empty()) throw PeerLost(describe_lost(lost, old_layout.world()));
  const auto sources = sources_by_preference(old_layout.world(), sorted);

  TransferPlan plan;
  for (int dst = 0; dst < new_world; ++dst) {
    plan_range(old_layout, new_layout, sorted, sources, dst, dst, false, plan.moves);
    // In a world of one, shard dst − 1 mod 1 is dst's own: a rank cannot be its own buddy.
    if (wards && new_world > 1)
      plan_range(old_layout, new_layout, sorted, sources, dst, (dst + new_world - 1) % new_world,
                 true, plan.moves);
  }
  return plan;
}

}  // namespace krab::elastic
