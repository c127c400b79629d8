// ZeRO shard replication on a buddy rank (parallel/zero/buddy.h, docs/design/elastic.md §4.2) on
// ranks that are threads of one process (loopback Gloo). The independent expectations: the
// owner's own shard (another rank's tensors, compared bit for bit with the buddy's copy, values
// and every optimizer field, at every step, before the all-gather could hide a difference); the
// same run without replication (final parameters bit for bit); memory_model.h's closed form of
// the ward term (exactly) and of the buddy's traffic (4Ψp/N sent per step); the ring's
// index arithmetic enumerated.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/errors.h"
#include "parallel/zero/buddy.h"
#include "parallel/zero/memory_model.h"
#include "parallel/zero/stage3_build.h"
#include "parallel/zero/stage3_engine.h"
#include "parallel/zero/zero_engine.h"
#include "support/gloo_ranks.h"
#include "zero_test_support.h"

namespace krab::parallel::zero {
namespace {

struct Case {
  std::string model = "mlp";  // mlp | gpt
  std::string optimizer = "adam";
  int world = 2;
  int stage = 1;
  bool replicate = true;
  int steps = 10;
  int accum = 1;
  // after_restore() before the first step and, with every ward corrupted first, after step 2.
  bool restores = false;
};

std::string name(const Case& c) {
  return c.model + " " + c.optimizer + " stage " + std::to_string(c.stage) + " W " +
         std::to_string(c.world) + (c.replicate ? " replicated" : "");
}

std::pair<at::Tensor, at::Tensor> batch(const Case& c, int64_t step, int64_t m, int rank) {
  auto g = at::detail::createCPUGenerator(2000 + 100 * step + 10 * m + rank);
  if (c.model == "gpt")
    return {at::randint(0, 29, {3, 8}, g, at::kLong), at::randint(0, 29, {3, 8}, g, at::kLong)};
  return {at::randn({6, 13}, g), at::randint(0, 5, {6}, g, at::kLong)};
}

std::unique_ptr<engine::Engine> make_engine(const Case& c, std::unique_ptr<comm::Communicator> g) {
  DataParallelEngineOptions dpo;
  dpo.total_steps = c.steps;
  dpo.global_micro_batch = 6 * c.world;
  auto model = zero_test::small_model(c.model, 17);
  if (c.stage == 3) {
    Stage3EngineOptions o;
    o.replicate_shards = c.replicate;
    o.data_parallel = dpo;
    return std::make_unique<Stage3Engine>(model, std::move(g), o,
                                          zero_test::optimizer_of(c.optimizer));
  }
  ZeroEngineOptions o;
  o.stage = c.stage;
  o.replicate_shards = c.replicate;
  o.data_parallel = dpo;
  return std::make_unique<ZeroEngine>(model, std::move(g), o, zero_test::optimizer_of(c.optimizer));
}

// One shard as a checkpoint sees it: the values and every optimizer field, Adam's step count
// as a one-element tensor (clones).
std::vector<at::Tensor> snapshot(const at::Tensor& values, torch::optim::Optimizer& o) {
  std::vector<at::Tensor> out{values.clone()};
  for (const auto& [key, state] : o.state()) {
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      out.push_back(adam->exp_avg().clone());
      out.push_back(adam->exp_avg_sq().clone());
      out.push_back(torch::tensor({adam->step()}, at::kLong));
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      out.push_back(sgd->momentum_buffer().clone());
    } else {
      ADD_FAILURE() << "an optimizer state this test does not know";
    }
  }
  return out;
}

std::vector<std::vector<at::Tensor>> snapshot(const engine::ShardedState& s) {
  std::vector<std::vector<at::Tensor>> out;
  for (size_t u = 0; u < s.values.size(); ++u)
    out.push_back(snapshot(s.values[u], *s.optimizers[u]));
  return out;
}

struct Outcome {
  // By step: every unit's own shard and ward copy right after apply(), before the gather.
  std::vector<std::vector<std::vector<at::Tensor>>> own, ward;
  int ward_shard = -1;
  bool ward_layout_is_own = false;
  at::Tensor params;           // every parameter whole, flattened, at the end
  comm::TrafficStats traffic;  // the steps' (construction excluded)
  engine::MemoryStats memory;
  WardBytes ward_bytes;
  std::vector<int64_t> unit_numel, shard_numel;  // the layout's
  // With Case::restores: own shard and ward right after each after_restore(), and the bytes
  // the second one sent point to point.
  std::vector<std::vector<std::vector<at::Tensor>>> restored_own, restored_ward;
  uint64_t resync_sent = 0;
};

at::Tensor whole_params(engine::Engine& e) {
  std::vector<at::Tensor> v;
  if (!e.visit_parameters([&](const std::string&, const at::Tensor& t) {
        v.push_back(t.detach().reshape({-1}).clone());
      }))
    for (auto& p : e.model().parameters()) v.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(v, 0);
}

const engine::ShardLayout& layout_of(engine::Engine& e) {
  if (auto* z = dynamic_cast<ZeroEngine*>(&e)) return z->layout();
  return dynamic_cast<Stage3Engine&>(e).layout();
}

const ShardBuddy* buddy_of(engine::Engine& e) {
  if (auto* z = dynamic_cast<ZeroEngine*>(&e)) return z->buddy();
  return dynamic_cast<Stage3Engine&>(e).buddy();
}

// What a restore that forgot the ward would leave: other values, no optimizer state.
void corrupt_ward(const engine::TrainState& s) {
  for (size_t u = 0; u < s.ward->values.size(); ++u) {
    s.ward->values[u].fill_(-7.0);
    set_tensor_state(*s.ward->optimizers[u], s.ward->values[u], {});
  }
}

void restore(engine::Engine& e, bool corrupt, Outcome& out) {
  if (corrupt) corrupt_ward(e.state());
  const uint64_t before = e.group()->traffic().bytes_sent[static_cast<size_t>(comm::OpKind::kSend)];
  e.after_restore();
  out.resync_sent =
      e.group()->traffic().bytes_sent[static_cast<size_t>(comm::OpKind::kSend)] - before;
  out.restored_own.push_back(snapshot(*e.state().sharded));
  out.restored_ward.push_back(snapshot(*e.state().ward));
}

// The training loop's calls (train/trainer.cpp), snapshots taken between apply and after_step.
void run_rank(const Case& c, engine::Engine& e, int rank, Outcome& out) {
  if (c.restores) restore(e, false, out);
  const comm::TrafficStats start = e.group()->traffic();
  while (auto plan = e.next_step()) {
    for (int m = 0; m < c.accum; ++m) {
      e.before_backward(m, m == c.accum - 1);
      auto [x, y] = batch(c, plan->step, m, rank);
      auto loss = e.model().loss(e.model().forward(x), y);
      (c.accum > 1 ? loss / static_cast<double>(c.accum) : loss).backward();
    }
    e.reduce_gradients();
    e.apply(c.optimizer == "adam" ? 0.002 : 0.05);
    const engine::TrainState s = e.state();
    out.own.push_back(snapshot(*s.sharded));
    if (s.ward) out.ward.push_back(snapshot(*s.ward));
    e.after_step(*plan);
    e.settle();
    if (c.restores && plan->step == 2) restore(e, true, out);
  }
  const comm::TrafficStats end = e.group()->traffic();
  for (size_t k = 0; k < end.bytes_sent.size(); ++k) {
    out.traffic.bytes_sent[k] = end.bytes_sent[k] - start.bytes_sent[k];
    out.traffic.ops[k] = end.ops[k] - start.ops[k];
  }
  const engine::TrainState s = e.state();
  out.ward_shard = s.ward_shard;
  out.ward_layout_is_own =
      s.ward != nullptr && s.ward->layout == s.sharded->layout && s.ward->stage == s.sharded->stage;
  out.memory = e.memory();
  if (const ShardBuddy* b = buddy_of(e)) out.ward_bytes = b->bytes();
  const engine::ShardLayout& layout = layout_of(e);
  for (int u = 0; u < layout.num_units(); ++u) {
    out.unit_numel.push_back(layout.unit(u).numel);
    out.shard_numel.push_back(layout.shard_numel(u));
  }
  out.params = whole_params(e);
}

std::vector<Outcome> train(const Case& c) {
  std::vector<Outcome> out(c.world);
  testing::run_gloo_ranks_owned(c.world, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(c, std::move(g));
    run_rank(c, *e, r, out[r]);
  });
  return out;
}

bool same_bits(const std::vector<std::vector<at::Tensor>>& a,
               const std::vector<std::vector<at::Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size()) return false;
    for (size_t i = 0; i < a[u].size(); ++i)
      if (!torch::equal(a[u][i], b[u][i])) return false;
  }
  return true;
}

MemoryInputs inputs_of(const Case& c, const Outcome& o) {
  MemoryInputs in;
  in.unit_numel = o.unit_numel;
  in.world_size = c.world;
  in.stage = c.stage;
  in.optimizer = c.optimizer == "sgd" ? OptimizerKind::kSgdMomentum : OptimizerKind::kAdam;
  in.micro_batches = c.accum;
  in.replicate_shards = c.replicate;
  return in;
}

// Every claim of the header for one case: the ward copy equals its owner's shard bit for bit
// after every step, training is unchanged, the ward's bytes and traffic are the closed forms.
void expect_replicated(Case c) {
  SCOPED_TRACE(name(c));
  const auto on = train(c);
  c.replicate = false;
  const auto off = train(c);
  c.replicate = true;
  const int W = c.world;
  int64_t shard_bytes = 0, units = 0;
  for (int64_t n : on[0].shard_numel) {
    shard_bytes += 4 * n;
    units += n > 0;
  }
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int owner = (r + W - 1) % W;
    ASSERT_EQ(on[r].ward_shard, owner);
    EXPECT_TRUE(on[r].ward_layout_is_own);
    EXPECT_EQ(off[r].ward_shard, -1);
    ASSERT_EQ(on[r].ward.size(), static_cast<size_t>(c.steps));
    for (int s = 0; s < c.steps; ++s)
      EXPECT_TRUE(same_bits(on[r].ward[s], on[owner].own[s])) << "step " << s;
    // Replication changes no bit of training, and every rank ends with the same model.
    EXPECT_TRUE(torch::equal(on[r].params, off[r].params));
    EXPECT_TRUE(torch::equal(on[r].params, on[0].params));

    // The ward term is a closed form: equal, not close.
    const MemoryPrediction want = predict_memory(inputs_of(c, on[r]));
    EXPECT_EQ(on[r].ward_bytes.total(), want.ward);
    EXPECT_EQ(on[r].ward_bytes.grads, shard_bytes);
    EXPECT_EQ(on[r].ward_bytes.values, c.stage == 3 ? shard_bytes : 0);
    // memory() counts exactly the ward's bytes on top of the run without it.
    const auto& m1 = on[r].memory;
    const auto& m0 = off[r].memory;
    EXPECT_EQ(m1.optimizer - m0.optimizer, on[r].ward_bytes.optimizer);
    EXPECT_EQ((m1.params + m1.grads + m1.optimizer + m1.working_set_peak) -
                  (m0.params + m0.grads + m0.optimizer + m0.working_set_peak),
              want.ward);

    // Traffic: one send of the gradient shard per unit and step, 4Ψp/N bytes; all else equal.
    using comm::OpKind;
    const auto k = [](OpKind op) { return static_cast<size_t>(op); };
    EXPECT_EQ(on[r].traffic.bytes_sent[k(OpKind::kSend)],
              static_cast<uint64_t>(c.steps * shard_bytes));
    EXPECT_EQ(on[r].traffic.ops[k(OpKind::kSend)], static_cast<uint64_t>(c.steps * units));
    EXPECT_EQ(on[r].traffic.ops[k(OpKind::kRecv)], static_cast<uint64_t>(c.steps * units));
    const comm::TrafficStats model = zero_traffic(inputs_of(c, on[r]));
    EXPECT_EQ(static_cast<uint64_t>(c.steps) * model.bytes_sent[k(OpKind::kSend)],
              on[r].traffic.bytes_sent[k(OpKind::kSend)]);
    for (size_t op = 0; op < k(OpKind::kCount); ++op) {
      if (op == k(OpKind::kSend) || op == k(OpKind::kRecv)) continue;
      EXPECT_EQ(on[r].traffic.bytes_sent[op], off[r].traffic.bytes_sent[op]) << "op " << op;
      EXPECT_EQ(on[r].traffic.ops[op], off[r].traffic.ops[op]) << "op " << op;
    }
  }
}

TEST(ShardBuddy, RingIndicesPairEveryShardWithOneOtherRank) {
  EXPECT_EQ(buddy_rank(0, 1), -1);
  EXPECT_EQ(ward_shard(0, 1), -1);
  for (int w = 2; w <= 9; ++w) {
    std::vector<int> held(w, 0);
    for (int r = 0; r < w; ++r) {
      const int b = buddy_rank(r, w), ward = ward_shard(r, w);
      ASSERT_TRUE(b >= 0 && b < w && b != r);
      ASSERT_TRUE(ward >= 0 && ward < w && ward != r);
      EXPECT_EQ(ward_shard(b, w), r);  // my buddy's ward is my shard
      EXPECT_EQ(buddy_rank(ward, w), r);
      ++held[ward];
    }
    for (int n : held) EXPECT_EQ(n, 1);  // every shard has exactly one copy elsewhere
  }
}

// ShardBuddy alone over a hand-made layout (an empty root, a unit of 37 elements, one of 21) on
// three ranks: the exchange is a ring shift — rank r steps rank r−1's gradient, whose values
// are known — units of 0 elements send nothing, and an exchange that failed leaves nothing to
// step.
TEST(ShardBuddy, ExchangeShiftsGradientsAroundTheRing) {
  const int W = 3;
  const engine::ShardLayout layout =
      engine::plan_layout({{"", {}}, {"a", {{"a.w", {37}}}}, {"b", {{"b.w", {3, 7}}}}}, W, 4);
  const OptimizerFactory plain_sgd = [](std::vector<at::Tensor> ps) {
    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(1.0));
  };
  testing::run_gloo_ranks(W, [&](int r, comm::Communicator& g) {
    const auto grads_of = [&](int rank) {
      std::vector<at::Tensor> out;
      for (int u = 0; u < layout.num_units(); ++u)
        out.push_back(layout.shard_numel(u) == 0
                          ? at::Tensor()
                          : torch::full({layout.shard_numel(u)}, 10.0 * rank + u + 1));
      return out;
    };
    std::vector<at::Tensor> values;
    for (int u = 0; u < layout.num_units(); ++u)
      values.push_back(torch::full({layout.shard_numel(u)}, 100.0));
    ShardBuddy buddy(layout, 2, r, values, /*values_owned=*/true, plain_sgd);
    ASSERT_EQ(buddy.ward(), (r + W - 1) % W);
    buddy.exchange(g, grads_of(r));
    buddy.step(0.5);
    for (int u = 1; u < layout.num_units(); ++u)
      EXPECT_TRUE(torch::equal(
          values[u], torch::full_like(values[u], 100.0 - 0.5 * (10.0 * buddy.ward() + u + 1))))
          << "unit " << u;
    const auto t = g.traffic();
    EXPECT_EQ(t.ops[static_cast<size_t>(comm::OpKind::kSend)], 2u);  // the empty root sends nothing
    EXPECT_EQ(t.bytes_sent[static_cast<size_t>(comm::OpKind::kSend)],
              static_cast<uint64_t>(4 * (layout.shard_numel(1) + layout.shard_numel(2))));
    EXPECT_EQ(buddy.bytes().values, 4 * (layout.shard_numel(1) + layout.shard_numel(2)));

    // A failed exchange (the group aborted) throws and leaves no gradient to step.
    g.abort("test");
    const at::Tensor before = values[1].clone();
    EXPECT_THROW(buddy.exchange(g, grads_of(r)), MembershipChanged);
    buddy.step(0.5);
    EXPECT_TRUE(torch::equal(values[1], before));
  });
}

// Stages 1-3, Adam and SGD with momentum, W = 2 and 4, 10 steps on the mlp (odd sizes: every
// shard padded). One test each, to keep each short.
class Replicated : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(Replicated, WardIsTheOwnersShardBitForBit) {
  const auto& [stage, world, optimizer] = GetParam();
  expect_replicated({"mlp", optimizer, world, stage});
}

INSTANTIATE_TEST_SUITE_P(ShardBuddy, Replicated,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 4),
                                            ::testing::Values("adam", "sgd")));

// Several units and a root (gpt), and gradient accumulation (stage 2 and 3 reduce every
// micro-batch; the exchange sends only the final sum).
TEST(ShardBuddy, UnitsRootAndAccumulation) {
  expect_replicated({"gpt", "adam", 2, 2, true, 4, 2});
  expect_replicated({"gpt", "adam", 4, 3, true, 4, 2});
  expect_replicated({"gpt", "sgd", 2, 1, true, 4, 2});
}

// after_restore() makes every ward its owner's again whatever it held (values, every field,
// Adam's step count; no state before the first step), and the wards stay equal afterwards.
// Its point-to-point bytes: the values, a 16-byte header and the k fields per unit.
void expect_resync(Case c) {
  SCOPED_TRACE(name(c));
  c.restores = true;
  const auto out = train(c);
  const int W = c.world;
  const int64_t k = c.optimizer == "sgd" ? 1 : 2;
  uint64_t want_sent = 0;
  for (int64_t n : out[0].shard_numel)
    if (n > 0) want_sent += static_cast<uint64_t>(4 * n * (1 + k) + 16);
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int owner = (r + W - 1) % W;
    ASSERT_EQ(out[r].restored_ward.size(), 2u);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_TRUE(same_bits(out[r].restored_ward[i], out[owner].restored_own[i]))
          << "restore " << i;
    for (const auto& unit : out[r].restored_ward[0]) EXPECT_EQ(unit.size(), 1u);  // values only
    EXPECT_EQ(out[r].resync_sent, want_sent);
    for (int s = 0; s < c.steps; ++s)
      EXPECT_TRUE(same_bits(out[r].ward[s], out[owner].own[s])) << "step " << s;
  }
}

TEST(ShardBuddy, AfterRestoreRecopiesTheWardFromItsOwner) {
  expect_resync({"mlp", "adam", 2, 1, true, 5});
  expect_resync({"mlp", "sgd", 4, 2, true, 5});
  expect_resync({"gpt", "adam", 4, 3, true, 5});
}

TEST(ShardBuddy, AGroupOfOneReplicatesNothing) {
  for (int stage : {1, 3}) {
    Case c{"mlp", "adam", 1, stage, true, 2};
    const auto out = train(c);
    EXPECT_EQ(out[0].ward_shard, -1);
    EXPECT_TRUE(out[0].ward.empty());
    EXPECT_EQ(out[0].traffic.ops[static_cast<size_t>(comm::OpKind::kSend)], 0u);
    EXPECT_EQ(predict_memory(inputs_of(c, out[0])).ward, 0);
  }
}

// Sharded construction (stage3_build.h) keeps the ward masters as the units are adopted: equal
// to the owner's masters before any step.
TEST(ShardBuddy, ShardedConstructionKeepsTheWardMasters) {
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    models::ModelSpec s;
    s.name = "mlp";
    s.input_shape = {13};
    s.hidden = 19;
    s.num_classes = 5;
    torch::manual_seed(5 + r);  // different draws: adopt() broadcasts rank 0's
    Stage3EngineOptions o;
    o.replicate_shards = true;
    o.data_parallel.total_steps = 1;
    o.data_parallel.global_micro_batch = 12;
    auto e = make_stage3_engine(s, std::move(g), o, zero_test::optimizer_of("adam"));
    const auto st = e->state();
    ASSERT_NE(st.ward, nullptr);
    EXPECT_EQ(st.ward_shard, 1 - r);
    // The other rank's own masters are its flat's chunk, which every rank can gather whole.
    for (int u = 0; u < e->layout().num_units(); ++u) {
      at::Tensor flat = torch::empty({e->layout().unit(u).padded});
      e->group()->allgather(e->storage().master(u), flat)->wait();
      const engine::Range w = e->layout().shard(u, st.ward_shard);
      EXPECT_TRUE(torch::equal(st.ward->values[u], flat.narrow(0, w.begin, w.size())));
    }
  });
}

// The ward term against the table of buddy.h, padding counted by brute force: the ward's
// gradient and optimizer state (and stage 3's master), nothing for a group of one, and every
// byte of it resident.
TEST(ShardBuddy, MemoryModelWardTermIsTheWardsShardState) {
  const std::vector<int64_t> units = {7, 0, 101, 33};
  for (int world = 1; world <= 5; ++world)
    for (int stage = 1; stage <= 3; ++stage)
      for (auto [kind, amsgrad, k] : std::vector<std::tuple<OptimizerKind, bool, int64_t>>{
               {OptimizerKind::kSgd, false, 0},
               {OptimizerKind::kSgdMomentum, false, 1},
               {OptimizerKind::kAdam, false, 2},
               {OptimizerKind::kAdamW, true, 3}}) {
        MemoryInputs in;
        in.unit_numel = units;
        in.world_size = world;
        in.stage = stage;
        in.optimizer = kind;
        in.amsgrad = amsgrad;
        const MemoryPrediction off = predict_memory(in);
        in.replicate_shards = true;
        const MemoryPrediction on = predict_memory(in);
        int64_t shard = 0;  // Σ S_u: each unit padded to a multiple of world x 16, split
        for (int64_t n : units) {
          int64_t padded = 0;
          while (padded < n) padded += world * 16;
          shard += padded / world;
        }
        const int64_t want = world < 2 ? 0 : 4 * shard * (1 + k + (stage == 3 ? 1 : 0));
        EXPECT_EQ(on.ward, want) << "W " << world << " stage " << stage << " k " << k;
        EXPECT_EQ(off.ward, 0);
        EXPECT_EQ(on.resident() - on.heap, off.resident() - off.heap + want);
        EXPECT_EQ(on.model_state(), off.model_state());
      }
}

TEST(ShardBuddy, RefusesOffloadAndStageZero) {
  testing::run_gloo_ranks_owned(1, [&](int, std::unique_ptr<comm::Communicator> g) {
    ZeroEngineOptions o;
    o.replicate_shards = true;
    o.offload_dir = "never-made";
    try {
      ZeroEngine e(zero_test::small_model("mlp", 1), std::move(g), o,
                   zero_test::optimizer_of("adam"));
      ADD_FAILURE() << "offload with replicate_shards accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.offload"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("replicate_shards"), std::string::npos) << e.what();
    }
  });
  testing::run_gloo_ranks_owned(1, [&](int, std::unique_ptr<comm::Communicator> g) {
    Stage3EngineOptions o;
    o.replicate_shards = true;
    o.offload_dir = "never-made";
    EXPECT_THROW(Stage3Engine(zero_test::small_model("mlp", 1), std::move(g), o,
                              zero_test::optimizer_of("adam")),
                 InvalidArgument);
  });
  MemoryInputs in;
  in.unit_numel = {100};
  in.replicate_shards = true;
  in.stage = 0;
  EXPECT_THROW(predict_memory(in), InvalidArgument);
  in.stage = 2;
  in.offload = Offload::kDisk;
  EXPECT_THROW(predict_memory(in), InvalidArgument);
}

}  // namespace
}  // namespace krab::parallel::zero
