#include "engine/shard_layout.h"

#include <algorithm>

#include "core/errors.h"

namespace krab::engine {
namespace {

// Sizes come from user models and configs (a 1B-parameter model at W = 1024, A = 256 is still
// far from 2^63, but a corrupt manifest need not be): every product and round-up is checked so
// an absurd input is refused instead of wrapping into a small, plausible layout.
int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  KRAB_CHECK_ARG(!__builtin_mul_overflow(a, b, &out), "shard layout: ", what, " overflows int64 (",
                 a, " * ", b, ")");
  return out;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  KRAB_CHECK_ARG(!__builtin_add_overflow(a, b, &out), "shard layout: ", what, " overflows int64 (",
                 a, " + ", b, ")");
  return out;
}

int64_t numel_of(const ParamShape& p) {
  int64_t n = 1;
  for (int64_t d : p.shape) {
    KRAB_CHECK_ARG(d >= 0, "shard layout: parameter '", p.name, "' has a negative dimension (", d,
                   ")");
    n = checked_mul(n, d, "the element count of '" + p.name + "'");
  }
  return n;
}

// roundup(numel, granule) without forming numel + granule - 1 past int64.
int64_t round_up(int64_t numel, int64_t granule, const std::string& what) {
  const int64_t whole = numel / granule + (numel % granule != 0 ? 1 : 0);
  return checked_mul(whole, granule, what);
}

std::string unit_label(const std::string& name) {
  return name.empty() ? std::string("<root>") : "'" + name + "'";
}

}  // namespace

const UnitLayout& ShardLayout::unit(int u) const {
  KRAB_CHECK_ARG(u >= 0 && u < num_units(), "shard layout: unit ", u, " out of range [0, ",
                 num_units(), ")");
  return units_[u];
}

int64_t ShardLayout::shard_numel(int u) const { return unit(u).padded / world_; }

Range ShardLayout::shard(int u, int rank) const {
  KRAB_CHECK_ARG(rank >= 0 && rank < world_, "shard layout: rank ", rank, " out of range [0, ",
                 world_, ")");
  const int64_t s = shard_numel(u);
  return Range{rank * s, (rank + 1) * s};
}

std::vector<Piece> ShardLayout::pieces(int u, int64_t lo, int64_t hi) const {
  const UnitLayout& ul = unit(u);
  KRAB_CHECK_ARG(0 <= lo && lo <= hi && hi <= ul.padded, "shard layout: range [", lo, ", ", hi,
                 ") is not inside unit ", unit_label(ul.name), "'s flat [0, ", ul.padded, ")");
  std::vector<Piece> out;
  // Spans are sorted by offset and do not overlap, so the first span ending after `lo` is the
  // first that can overlap; 0-element spans end where they begin and are skipped below.
  auto it = std::upper_bound(ul.params.begin(), ul.params.end(), lo,
                             [](int64_t v, const ParamSpan& p) { return v < p.offset + p.numel; });
  for (; it != ul.params.end() && it->offset < hi; ++it) {
    const int64_t begin = std::max(lo, it->offset);
    const int64_t end = std::min(hi, it->offset + it->numel);
    if (begin >= end) continue;
    out.push_back(
        Piece{static_cast<int>(it - ul.params.begin()), begin - it->offset, end - begin, begin});
  }
  return out;
}

std::optional<Loc> ShardLayout::locate(const std::string& param) const {
  auto it = by_name_.find(param);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

int64_t padded_numel(int64_t numel, int world, int64_t alignment) {
  KRAB_CHECK_ARG(numel >= 0 && world >= 1 && alignment >= 1,
                 "shard layout: padding needs numel >= 0, world >= 1, alignment >= 1; got ", numel,
                 ", ", world, ", ", alignment);
  return round_up(numel, checked_mul(world, alignment, "world * alignment"), "a padded size");
}

ShardLayout plan_layout(const std::vector<UnitParams>& units, int world, int64_t alignment) {
  KRAB_CHECK_ARG(world >= 1, "shard layout: world size must be >= 1, got ", world);
  KRAB_CHECK_ARG(alignment >= 1, "shard layout: alignment must be >= 1, got ", alignment);
  KRAB_CHECK_ARG(!units.empty(), "shard layout: no units (the root unit, index 0, is required)");
  ShardLayout out;
  out.world_ = world;
  out.alignment_ = alignment;
  const int64_t granule = checked_mul(world, alignment, "world * alignment");
  for (size_t u = 0; u < units.size(); ++u) {
    UnitLayout ul;
    ul.name = units[u].name;
    for (const ParamShape& p : units[u].params) {
      const int64_t n = numel_of(p);
      const Loc loc{static_cast<int>(u), static_cast<int>(ul.params.size()), ul.numel, n};
      auto [prev, fresh] = out.by_name_.emplace(p.name, loc);
      if (!fresh) {
        const int first = prev->second.unit;  // may be this unit, not yet in units_
        const std::string& other = first == loc.unit ? ul.name : out.units_[first].name;
        throw InvalidArgument(str_cat("shard layout: parameter '", p.name, "' appears twice (unit ",
                                      unit_label(other), " and unit ", unit_label(ul.name), ")"));
      }
      ul.params.push_back(ParamSpan{p.name, p.shape, ul.numel, n});
      ul.numel = checked_add(ul.numel, n, "the element count of unit " + unit_label(ul.name));
    }
    ul.padded = round_up(ul.numel, granule, "the padded size of unit " + unit_label(ul.name));
    out.units_.push_back(std::move(ul));
  }
  return out;
}

}  // namespace krab::engine
