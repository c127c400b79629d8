// ZeRO planning, part 1: which parameters form which unit (docs/design/zero-sharding.md §1.1).
// Pure functions over (name, shape) lists: no model, no tensors, no communication.
//
// A *unit* is a module whose parameters are gathered and freed together; the units become the
// granules of engine::plan_layout (engine/shard_layout.h). They are picked by `parallel.wrap`-
// style globs over module paths:
//
//   - a module path is a dotted prefix of a parameter name: "blocks.0.attn.qkv.weight" lies in
//     the modules "blocks", "blocks.0", "blocks.0.attn" and "blocks.0.attn.qkv";
//   - in a glob, `*` matches any run of characters inside ONE path component (never a '.'),
//     every other character matches itself: "blocks.*" matches "blocks.0" but not
//     "blocks.0.attn"; "layer*" matches "layer1" and "layer2"; "*" matches every top-level
//     module;
//   - a unit owns every parameter whose name starts with its path followed by '.';
//   - every parameter no unit owns belongs to the root unit (index 0, name ""), which may be
//     empty.
//
// Refusals (InvalidArgument, each prefixed "parallel.wrap: "):
//   - a glob that matches no candidate, naming the glob and the candidates;
//   - a unit nested in another ("'blocks.0.attn' (from 'blocks.*.attn') is inside unit
//     'blocks.0' (from 'blocks.*')"), naming both units and the globs that picked them;
//   - an empty glob, or one with an empty path component ("blocks..0", ".x").
//
// The callers pass the trainable parameters only (frozen parameters and buffers are never
// sharded) in model.named_parameters order; the order is kept inside every unit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/shard_layout.h"

namespace krab::parallel::zero {

// True when `path` matches `glob` under the rules above.
bool glob_matches(const std::string& glob, const std::string& path);

// Every module path that holds at least one of `params` (directly or in a descendant), in the
// order of its first parameter; the root module ("") is not listed. The candidates of a
// glob-based wrap.
std::vector<std::string> module_paths(const std::vector<engine::ParamShape>& params);

// The units that `globs` pick among `candidates` (module paths; module_paths(params) unless the
// model restricts them, e.g. to the TorchScript children whose call sites can be rewritten):
// result[0] is the root unit, then one unit per matched candidate in candidate order, each
// with its parameters in `params` order. A candidate several globs match is one unit. No
// globs: everything in the root unit. A matched candidate that holds no parameter is an empty
// unit. Throws InvalidArgument as listed above, or on a parameter name given twice.
std::vector<engine::UnitParams> plan_units(const std::vector<engine::ParamShape>& params,
                                           const std::vector<std::string>& candidates,
                                           const std::vector<std::string>& globs);

// `parallel.wrap: <text>` as globs: the comma-separated list, items trimmed (the config stores
// a YAML list joined by commas). "auto" is not a glob: plan_wrap resolves it. Throws
// InvalidArgument naming parallel.wrap for an empty item.
std::vector<std::string> wrap_globs(const std::string& text);

// The units `parallel.wrap: <text>` picks for a model with the trainable `params` (named-
// parameters order) whose Model::unit_candidates() are `model_candidates` (forward order):
//   auto   one unit per model candidate, in candidate order: exactly the submodules the model
//          runs through run_unit() (gpt's blocks, the cnn's and mlp's layers, the children of
//          a TorchScript module krab could split), so a unit is always something an engine
//          can act around. A model that offers no candidates falls back to `*` (every
//          top-level module holding parameters; none: everything in the root unit).
//   else   wrap_globs(text) over module_paths(params): any module may be a unit.
// plan_units' result and refusals ("parallel.wrap: 'x' matches no module; ...").
std::vector<engine::UnitParams> plan_wrap(const std::vector<engine::ParamShape>& params,
                                          const std::vector<std::string>& model_candidates,
                                          const std::string& text);

// How plan_wrap chose the units, for describe() and the report: "auto: the model's units",
// "auto: *, the model offers no units", or the globs as written ("blocks.*, head").
std::string wrap_source(const std::vector<std::string>& model_candidates, const std::string& text);

// The alignment of a shard in elements (§1.2): lcm(16, codec_chunk), where codec_chunk is the
// chunk the gradient codec quantizes in (256 for int8/onebit, 1 for none/fp16/bf16): 16 fp32
// elements are 64 bytes, and a shard then holds whole codec chunks. Throws InvalidArgument
// unless codec_chunk >= 1.
int64_t shard_alignment(int64_t codec_chunk);

}  // namespace krab::parallel::zero
