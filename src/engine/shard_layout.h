// ShardLayout: where every trainable parameter lives in the flat, sharded storage of ZeRO
// stages 1-3 (docs/design/zero-sharding.md §1.2). Pure: no tensors, no communication; the
// layout is a function of (units, parameter names and shapes, world size, alignment) alone, so
// every rank computes the same one and a checkpoint reader can recompute the writer's.
//
// A *unit* is a set of parameters gathered and freed together (parallel/zero/plan.h picks
// them). Unit u lays its parameters p_0..p_k end to end, in the order given (registration
// order), in one flat buffer padded with zeros to a multiple of world · alignment:
//
//   numel_u  = Σ numel(p_i)
//   padded_u = roundup(numel_u, W · A)
//   S_u      = padded_u / W                  the shard size, a multiple of A
//   rank r owns flat[r · S_u, (r + 1) · S_u); padding = flat[numel_u, padded_u)
//
// A unit of 0 elements has padded_u = 0: every rank's shard is empty.
//
// Units[0] is the root unit (every trainable parameter that no other unit claims); it may be
// empty. A ShardLayout is immutable once built and safe to read from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace krab::engine {

// A parameter as the planner sees it: its name (model.named_parameters) and shape. A shape of
// {} is a scalar (1 element); a dimension of 0 gives a parameter of 0 elements.
struct ParamShape {
  std::string name;
  std::vector<int64_t> shape;
};

// The parameters of one unit, in the order they are laid out.
struct UnitParams {
  std::string name;  // the unit's module path; "" for the root unit
  std::vector<ParamShape> params;
};

// A parameter placed in its unit's flat: elements [offset, offset + numel).
struct ParamSpan {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

struct UnitLayout {
  std::string name;
  std::vector<ParamSpan> params;
  int64_t numel = 0;   // Σ numel of params: flat[0, numel) holds parameters
  int64_t padded = 0;  // roundup(numel, world · alignment): the flat's length
};

// A half-open range of elements [begin, end) of a unit's flat.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
};

// A run of one parameter's elements inside a range of the flat: elements
// [param_offset, param_offset + length) of units[u].params[param] (row-major, as
// tensor.view(-1) numbers them) sit at flat[flat_offset, flat_offset + length).
struct Piece {
  int param = 0;
  int64_t param_offset = 0;
  int64_t length = 0;
  int64_t flat_offset = 0;
  bool operator==(const Piece& o) const {
    return param == o.param && param_offset == o.param_offset && length == o.length &&
           flat_offset == o.flat_offset;
  }
};

// Where a parameter lives: units[unit].params[param], at flat[offset, offset + numel).
struct Loc {
  int unit = 0;
  int param = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};

class ShardLayout {
 public:
  // Use plan_layout(); a default-constructed layout has no units and world 0.
  ShardLayout() = default;

  int world() const { return world_; }
  int64_t alignment() const { return alignment_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const std::vector<UnitLayout>& units() const { return units_; }
  const UnitLayout& unit(int u) const;

  // S_u = padded_u / world: every rank's shard of unit u has this many elements.
  int64_t shard_numel(int unit) const;
  // Rank `rank`'s shard of unit `unit`: [rank · S_u, (rank + 1) · S_u). The shards of ranks
  // 0..world-1 tile [0, padded_u) in rank order. Throws InvalidArgument on a unit or rank out
  // of range.
  Range shard(int unit, int rank) const;

  // The pieces of flat[lo, hi) of unit `unit`, in flat order: one per parameter that overlaps
  // the range, clipped to it. Padding and 0-element parameters yield no piece, so the pieces
  // of shard(u, 0), shard(u, 1), ... concatenated are exactly the non-empty parameters of the
  // unit, in order, each split where a shard boundary cuts it. The one function that
  // resharding, export and the stage-3 views are built on. Throws InvalidArgument unless
  // 0 <= lo <= hi <= padded_u.
  std::vector<Piece> pieces(int unit, int64_t lo, int64_t hi) const;
  std::vector<Piece> pieces(int unit, Range r) const { return pieces(unit, r.begin, r.end); }

  // The unit and place of the parameter named `param`; nullopt if no unit holds it (a frozen
  // parameter, a buffer or a name from another model).
  std::optional<Loc> locate(const std::string& param) const;

 private:
  friend ShardLayout plan_layout(const std::vector<UnitParams>&, int, int64_t);

  int world_ = 0;
  int64_t alignment_ = 0;
  std::vector<UnitLayout> units_;
  std::unordered_map<std::string, Loc> by_name_;
};

// padded_u of a unit of `numel` elements: numel rounded up to a multiple of world · alignment.
// The one rounding rule of the layout: plan_layout pads with it, and the memory model
// (parallel/zero/memory_model.h) predicts with it, so a prediction's bytes are the layout's.
// Throws InvalidArgument when numel < 0, world < 1, alignment < 1 or the result overflows int64.
int64_t padded_numel(int64_t numel, int world, int64_t alignment);

// Lays out `units` (units[0] = root; at least one unit) for `world` ranks with shards that are
// multiples of `alignment` elements. Pure and deterministic. Throws InvalidArgument when
// world < 1, alignment < 1, units is empty, a shape has a negative dimension, a parameter name
// appears twice (the message names it and both units) or a size overflows int64.
ShardLayout plan_layout(const std::vector<UnitParams>& units, int world, int64_t alignment);

}  // namespace krab::engine
