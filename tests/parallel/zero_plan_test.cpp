// ZeRO planning: the flat shard layout (engine/shard_layout.h) and the units picked by wrap
// globs (parallel/zero/plan.h). Pure functions: hand-worked layouts first, then a matrix over
// world size x unit size x alignment checked against properties computed independently here.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/errors.h"
#include "engine/shard_layout.h"
#include "parallel/zero/plan.h"

namespace krab::parallel::zero {
namespace {

using engine::ParamShape;
using engine::Piece;
using engine::plan_layout;
using engine::Range;
using engine::ShardLayout;
using engine::UnitParams;

// The message of the InvalidArgument `f` throws; fails the test if it throws nothing.
std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return "";
}

std::vector<std::string> names_of(const UnitParams& u) {
  std::vector<std::string> out;
  for (const ParamShape& p : u.params) out.push_back(p.name);
  return out;
}

// ---- layout: hand-worked ----

TEST(ShardLayout, HandWorkedUnitOfThreeParameters) {
  // a: 3, b: 2x5 = 10, c: scalar = 1 -> 14 elements. W = 4, A = 2: granule 8, padded 16, S = 4.
  //   flat: a a a b | b b b b | b b b b | b c . .
  ShardLayout l = plan_layout({{"", {{"a", {3}}, {"b", {2, 5}}, {"c", {}}}}}, 4, 2);
  ASSERT_EQ(l.num_units(), 1);
  EXPECT_EQ(l.unit(0).numel, 14);
  EXPECT_EQ(l.unit(0).padded, 16);
  EXPECT_EQ(l.shard_numel(0), 4);
  EXPECT_EQ(l.shard(0, 0), (Range{0, 4}));
  EXPECT_EQ(l.shard(0, 3), (Range{12, 16}));
  EXPECT_EQ(l.pieces(0, l.shard(0, 0)), (std::vector<Piece>{{0, 0, 3, 0}, {1, 0, 1, 3}}));
  EXPECT_EQ(l.pieces(0, l.shard(0, 1)), (std::vector<Piece>{{1, 1, 4, 4}}));
  EXPECT_EQ(l.pieces(0, l.shard(0, 2)), (std::vector<Piece>{{1, 5, 4, 8}}));
  EXPECT_EQ(l.pieces(0, l.shard(0, 3)), (std::vector<Piece>{{1, 9, 1, 12}, {2, 0, 1, 13}}));
  EXPECT_TRUE(l.pieces(0, 14, 16).empty());  // padding
  EXPECT_EQ(l.pieces(0, 2, 2), std::vector<Piece>{});
  auto b = l.locate("b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->unit, 0);
  EXPECT_EQ(b->param, 1);
  EXPECT_EQ(b->offset, 3);
  EXPECT_EQ(b->numel, 10);
  EXPECT_FALSE(l.locate("d").has_value());
}

TEST(ShardLayout, RootPlusUnitsEachPaddedOnItsOwn) {
  // Root 5 (A = 16, W = 2: granule 32 -> padded 32), unit "u1" 32 (exactly 32), "u2" empty,
  // "u3" 33 -> 64.
  ShardLayout l = plan_layout({{"", {{"w", {5}}}},
                               {"u1", {{"u1.w", {4, 8}}}},
                               {"u2", {}},
                               {"u3", {{"u3.a", {0, 7}}, {"u3.b", {33}}}}},
                              2, 16);
  EXPECT_EQ(l.unit(0).padded, 32);
  EXPECT_EQ(l.unit(1).padded, 32);
  EXPECT_EQ(l.unit(2).padded, 0);
  EXPECT_EQ(l.shard(2, 1), (Range{0, 0}));
  EXPECT_TRUE(l.pieces(2, l.shard(2, 0)).empty());
  EXPECT_EQ(l.unit(3).padded, 64);
  EXPECT_EQ(l.shard(3, 1), (Range{32, 64}));
  // The 0-element u3.a yields no piece; u3.b starts at 0 too.
  EXPECT_EQ(l.pieces(3, l.shard(3, 0)), (std::vector<Piece>{{1, 0, 32, 0}}));
  EXPECT_EQ(l.pieces(3, l.shard(3, 1)), (std::vector<Piece>{{1, 32, 1, 32}}));
  EXPECT_EQ(l.locate("u3.b")->unit, 3);
  EXPECT_EQ(l.locate("u3.a")->numel, 0);
  EXPECT_EQ(l.locate("u1.w")->offset, 0);
}

TEST(ShardLayout, WorldOneOwnsTheWholePaddedFlat) {
  ShardLayout l = plan_layout({{"", {{"x", {17}}}}}, 1, 16);
  EXPECT_EQ(l.shard(0, 0), (Range{0, 32}));
  EXPECT_EQ(l.pieces(0, l.shard(0, 0)), (std::vector<Piece>{{0, 0, 17, 0}}));
}

// ---- layout: the matrix ----

// Parameters that sum to `numel`, of uneven sizes, with 0-element and scalar ones mixed in.
std::vector<ParamShape> params_summing_to(int64_t numel, const std::string& prefix) {
  std::vector<ParamShape> out;
  const int64_t sizes[] = {1, 0, 7, 300, 2, 4096, 13};
  int64_t left = numel;
  for (int i = 0; left > 0; ++i) {
    const int64_t n = std::min(left, sizes[i % 7]);
    const std::string name = prefix + "p" + std::to_string(i);
    if (n == 1 && i % 2 == 0)
      out.push_back({name, {}});  // a scalar
    else
      out.push_back({name, {n}});
    left -= n;
  }
  out.push_back({prefix + "empty", {3, 0}});
  return out;
}

// Checks every property of §1.2 for unit `u` against values computed here.
void check_unit(const ShardLayout& l, int u, int world, int64_t a, int64_t numel) {
  SCOPED_TRACE(testing::Message() << "W=" << world << " A=" << a << " numel=" << numel);
  const auto& ul = l.unit(u);
  ASSERT_EQ(ul.numel, numel);
  // padded: the least multiple of W*A that is >= numel (by counting up, not by formula).
  int64_t padded = 0;
  while (padded < numel) padded += world * a;
  ASSERT_EQ(ul.padded, padded);
  // Shards: equal, multiples of A, tiling [0, padded) in rank order.
  int64_t at = 0;
  for (int r = 0; r < world; ++r) {
    const Range s = l.shard(u, r);
    EXPECT_EQ(s.begin, at);
    EXPECT_EQ(s.size(), padded / world);
    EXPECT_EQ(s.size() % a, 0);
    at = s.end;
  }
  EXPECT_EQ(at, padded);
  // Pieces of all ranks, concatenated: every non-empty parameter, whole and in order.
  int param = 0;
  int64_t in_param = 0, covered = 0;
  for (int r = 0; r < world; ++r) {
    const Range s = l.shard(u, r);
    for (const Piece& p : l.pieces(u, s)) {
      while (param < static_cast<int>(ul.params.size()) && ul.params[param].numel == 0) ++param;
      ASSERT_EQ(p.param, param);
      ASSERT_EQ(p.param_offset, in_param);
      ASSERT_GT(p.length, 0);
      EXPECT_EQ(p.flat_offset, ul.params[param].offset + p.param_offset);
      EXPECT_GE(p.flat_offset, s.begin);
      EXPECT_LE(p.flat_offset + p.length, s.end);
      covered += p.length;
      in_param += p.length;
      if (in_param == ul.params[param].numel) {
        ++param;
        in_param = 0;
      }
    }
  }
  while (param < static_cast<int>(ul.params.size()) && ul.params[param].numel == 0) ++param;
  EXPECT_EQ(param, static_cast<int>(ul.params.size()));
  EXPECT_EQ(covered, numel);
  EXPECT_TRUE(l.pieces(u, numel, padded).empty());  // padding yields no piece
  // locate() round-trips every parameter.
  for (size_t i = 0; i < ul.params.size(); ++i) {
    auto loc = l.locate(ul.params[i].name);
    ASSERT_TRUE(loc.has_value());
    EXPECT_EQ(loc->unit, u);
    EXPECT_EQ(loc->param, static_cast<int>(i));
    EXPECT_EQ(loc->offset, ul.params[i].offset);
    EXPECT_EQ(loc->numel, ul.params[i].numel);
  }
}

TEST(ShardLayout, MatrixOfWorldsSizesAndAlignments) {
  for (int64_t a : {int64_t{1}, int64_t{16}, int64_t{48}, int64_t{256}}) {
    std::vector<UnitParams> units;
    std::vector<int64_t> sizes = {0, 1, a - 1, a, 1237, (int64_t{1} << 20) + 17};
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string name = i == 0 ? "" : "u" + std::to_string(i);
      units.push_back({name, params_summing_to(sizes[i], name + ".")});
    }
    for (int world : {1, 2, 3, 4, 7, 8}) {
      ShardLayout l = plan_layout(units, world, a);
      ASSERT_EQ(l.num_units(), static_cast<int>(units.size()));
      for (size_t u = 0; u < units.size(); ++u)
        check_unit(l, static_cast<int>(u), world, a, sizes[u]);
    }
  }
}

TEST(ShardLayout, PiecesOfAnyRangeAreClippedToIt) {
  // Every [lo, hi) of a small unit against a per-element owner table built here.
  ShardLayout l = plan_layout({{"", {{"a", {3}}, {"z", {0}}, {"b", {5}}, {"c", {1}}}}}, 3, 2);
  const std::vector<int> owner = {0, 0, 0, 2, 2, 2, 2, 2, 3, -1, -1, -1};  // padded 12
  ASSERT_EQ(l.unit(0).padded, 12);
  for (int64_t lo = 0; lo <= 12; ++lo) {
    for (int64_t hi = lo; hi <= 12; ++hi) {
      std::vector<int> got;
      for (const Piece& p : l.pieces(0, lo, hi))
        for (int64_t k = 0; k < p.length; ++k) {
          got.push_back(p.param);
          EXPECT_EQ(l.unit(0).params[p.param].offset + p.param_offset + k, p.flat_offset + k);
        }
      std::vector<int> want;
      for (int64_t k = lo; k < hi; ++k)
        if (owner[k] >= 0) want.push_back(owner[k]);
      EXPECT_EQ(got, want) << "[" << lo << ", " << hi << ")";
    }
  }
}

TEST(ShardLayout, Refusals) {
  EXPECT_NE(refusal([] { plan_layout({{"", {}}}, 0, 16); }).find("world size"), std::string::npos);
  EXPECT_NE(refusal([] { plan_layout({{"", {}}}, 2, 0); }).find("alignment"), std::string::npos);
  EXPECT_NE(refusal([] { plan_layout({}, 2, 16); }).find("root unit"), std::string::npos);
  EXPECT_NE(refusal([] {
              plan_layout({{"", {{"w", {2, -1}}}}}, 2, 16);
            }).find("'w'"),
            std::string::npos);
  const std::string dup = refusal([] {
    plan_layout({{"", {{"w", {2}}}}, {"blk", {{"w", {3}}}}}, 2, 16);
  });
  EXPECT_NE(dup.find("'w' appears twice"), std::string::npos) << dup;
  EXPECT_NE(dup.find("<root>"), std::string::npos) << dup;
  EXPECT_NE(dup.find("'blk'"), std::string::npos) << dup;
  const int64_t big = int64_t{1} << 40;
  EXPECT_NE(refusal([&] {
              plan_layout({{"", {{"w", {big, big}}}}}, 2, 16);
            }).find("overflows"),
            std::string::npos);
  const int64_t half = int64_t{1} << 62;  // two of them sum past int64
  EXPECT_NE(refusal([&] {
              plan_layout({{"", {{"w", {half}}, {"v", {half}}}}}, 2, 16);
            }).find("overflows"),
            std::string::npos);
  const int64_t most = std::numeric_limits<int64_t>::max() - 1;  // rounds up past int64
  EXPECT_NE(refusal([&] {
              plan_layout({{"", {{"w", {most}}}}}, 2, 16);
            }).find("padded size"),
            std::string::npos);
  ShardLayout l = plan_layout({{"", {{"w", {20}}}}}, 2, 16);
  EXPECT_NE(refusal([&] { l.shard(0, 2); }).find("rank 2"), std::string::npos);
  EXPECT_NE(refusal([&] { l.shard(1, 0); }).find("unit 1"), std::string::npos);
  EXPECT_NE(refusal([&] { l.pieces(0, 0, 33); }).find("[0, 33)"), std::string::npos);
  EXPECT_NE(refusal([&] { l.pieces(0, 5, 4); }).find("[5, 4)"), std::string::npos);
}

// ---- units from wrap globs ----

TEST(ZeroGlobs, OneStarIsOneComponent) {
  EXPECT_TRUE(glob_matches("blocks.*", "blocks.0"));
  EXPECT_TRUE(glob_matches("blocks.*", "blocks.11"));
  EXPECT_FALSE(glob_matches("blocks.*", "blocks.0.attn"));
  EXPECT_FALSE(glob_matches("blocks.*", "blocks"));
  EXPECT_TRUE(glob_matches("layer*", "layer1"));
  EXPECT_TRUE(glob_matches("layer*", "layer"));
  EXPECT_FALSE(glob_matches("layer*", "layer1.0"));
  EXPECT_FALSE(glob_matches("layer*", "xlayer1"));
  EXPECT_TRUE(glob_matches("*", "fc"));
  EXPECT_FALSE(glob_matches("*", "fc.0"));
  EXPECT_TRUE(glob_matches("*.*.attn", "blocks.3.attn"));
  EXPECT_TRUE(glob_matches("b*s.*", "blocks.3"));
  EXPECT_TRUE(glob_matches("*a*a*b", "xaaab"));
  EXPECT_FALSE(glob_matches("*a*a*b", "xaab_"));
  EXPECT_TRUE(glob_matches("fc", "fc"));
  EXPECT_FALSE(glob_matches("fc", "fc1"));
}

std::vector<ParamShape> gpt_params() {
  std::vector<ParamShape> p = {{"tok_emb.weight", {50, 8}}, {"pos_emb.weight", {16, 8}}};
  for (int b = 0; b < 2; ++b) {
    const std::string s = "blocks." + std::to_string(b) + ".";
    p.push_back({s + "ln1.weight", {8}});
    p.push_back({s + "attn.qkv.weight", {24, 8}});
    p.push_back({s + "attn.proj.weight", {8, 8}});
    p.push_back({s + "mlp.fc.weight", {32, 8}});
  }
  p.push_back({"ln_f.weight", {8}});
  p.push_back({"head.weight", {50, 8}});
  return p;
}

TEST(ZeroUnits, ModulePathsInFirstParameterOrder) {
  const std::vector<std::string> want = {"tok_emb",
                                         "pos_emb",
                                         "blocks",
                                         "blocks.0",
                                         "blocks.0.ln1",
                                         "blocks.0.attn",
                                         "blocks.0.attn.qkv",
                                         "blocks.0.attn.proj",
                                         "blocks.0.mlp",
                                         "blocks.0.mlp.fc",
                                         "blocks.1",
                                         "blocks.1.ln1",
                                         "blocks.1.attn",
                                         "blocks.1.attn.qkv",
                                         "blocks.1.attn.proj",
                                         "blocks.1.mlp",
                                         "blocks.1.mlp.fc",
                                         "ln_f",
                                         "head"};
  EXPECT_EQ(module_paths(gpt_params()), want);
}

TEST(ZeroUnits, GptBlocksAndTheRootUnit) {
  const auto params = gpt_params();
  const auto units = plan_units(params, module_paths(params), {"blocks.*"});
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].name, "");
  EXPECT_EQ(names_of(units[0]), (std::vector<std::string>{"tok_emb.weight", "pos_emb.weight",
                                                          "ln_f.weight", "head.weight"}));
  EXPECT_EQ(units[1].name, "blocks.0");
  EXPECT_EQ(names_of(units[1]),
            (std::vector<std::string>{"blocks.0.ln1.weight", "blocks.0.attn.qkv.weight",
                                      "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight"}));
  EXPECT_EQ(units[2].name, "blocks.1");
  EXPECT_EQ(units[2].params[1].shape, (std::vector<int64_t>{24, 8}));
  // End to end: the units lay out, and every parameter is found where its unit says.
  ShardLayout l = plan_layout(units, 3, 16);
  EXPECT_EQ(l.locate("blocks.1.mlp.fc.weight")->unit, 2);
  EXPECT_EQ(l.locate("head.weight")->unit, 0);
  EXPECT_EQ(l.unit(1).numel, 8 + 192 + 64 + 256);
  EXPECT_EQ(l.unit(1).padded, 528);  // roundup(520, 48)
}

TEST(ZeroUnits, SeveralGlobsOverlappingGlobsAndEmptyUnits) {
  const std::vector<ParamShape> params = {{"conv1.weight", {4, 1, 3, 3}},
                                          {"layer1.0.conv.weight", {4, 4, 3, 3}},
                                          {"fc.weight", {10, 4}},
                                          {"layer2.0.conv.weight", {4, 4, 3, 3}},
                                          {"fc.bias", {10}}};
  const auto units = plan_units(params, module_paths(params), {"layer*", "fc", "layer2"});
  ASSERT_EQ(units.size(), 4u);  // root, layer1, fc, layer2: layer2 picked twice is one unit
  EXPECT_EQ(names_of(units[0]), (std::vector<std::string>{"conv1.weight"}));
  EXPECT_EQ(units[1].name, "layer1");
  EXPECT_EQ(units[2].name, "fc");
  EXPECT_EQ(names_of(units[2]), (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(units[3].name, "layer2");
  // No globs: everything is the root unit.
  const auto whole = plan_units(params, module_paths(params), {});
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].params.size(), params.size());
  // A candidate the caller lists without parameters is an empty unit.
  const auto empty = plan_units(params, {"fc", "act"}, {"act"});
  ASSERT_EQ(empty.size(), 2u);
  EXPECT_TRUE(empty[1].params.empty());
  EXPECT_EQ(plan_layout(empty, 4, 16).unit(1).padded, 0);
}

TEST(ZeroUnits, RefusalsNameTheGlobAndTheUnits) {
  const auto params = gpt_params();
  const auto cands = module_paths(params);
  const std::string nested = refusal([&] {
    plan_units(params, cands, {"blocks.*", "blocks.*.attn"});
  });
  EXPECT_NE(nested.find("parallel.wrap: 'blocks.0.attn' (from 'blocks.*.attn') is inside unit "
                        "'blocks.0' (from 'blocks.*')"),
            std::string::npos)
      << nested;
  const std::string none = refusal([&] { plan_units(params, cands, {"blocks.*", "block.*"}); });
  EXPECT_NE(none.find("'block.*' matches no module"), std::string::npos) << none;
  EXPECT_NE(none.find("blocks.0, blocks.0.ln1"), std::string::npos) << none;
  EXPECT_NE(none.find("head"), std::string::npos) << none;
  EXPECT_NE(refusal([&] { plan_units(params, cands, {""}); }).find("empty glob"),
            std::string::npos);
  EXPECT_NE(refusal([&] { plan_units(params, cands, {"blocks..0"}); }).find("'blocks..0'"),
            std::string::npos);
  std::vector<ParamShape> twice = {{"fc.weight", {2}}, {"fc.weight", {2}}};
  EXPECT_NE(refusal([&] { plan_units(twice, {"fc"}, {"fc"}); }).find("'fc.weight' is listed twice"),
            std::string::npos);
  // A model whose parameters all sit in the root module has no candidate at all.
  const std::string flat = refusal([] { plan_units({{"w", {2}}}, {}, {"*"}); });
  EXPECT_NE(flat.find("'*' matches no module"), std::string::npos) << flat;
  EXPECT_NE(flat.find("(none"), std::string::npos) << flat;
}

TEST(ZeroUnits, ShardAlignment) {
  EXPECT_EQ(shard_alignment(1), 16);
  EXPECT_EQ(shard_alignment(256), 256);
  EXPECT_EQ(shard_alignment(3), 48);
  EXPECT_EQ(shard_alignment(24), 48);
  EXPECT_NE(refusal([] { shard_alignment(0); }).find("codec chunk"), std::string::npos);
}

}  // namespace
}  // namespace krab::parallel::zero
