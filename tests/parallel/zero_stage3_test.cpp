// ZeRO stage 3 (parallel/zero/stage3_engine.h) on ranks that are threads of one process
// (loopback Gloo). The independent expectation is the data-parallel engine (stage 0) driven
// through the same calls on the same model, data and optimizer: bit-identical reduced
// gradients and parameters on two ranks without accumulation (design §1.5), within 1e-5
// otherwise; the traffic meter and memory() against memory_model.h's closed forms; the unit
// flats really hold 0 bytes between steps.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "compress/options.h"
#include "core/errors.h"
#include "models/describe.h"
#include "parallel/compression_hook.h"
#include "parallel/zero/memory_model.h"
#include "parallel/zero/plan.h"
#include "parallel/zero/stage3_build.h"
#include "parallel/zero/stage3_engine.h"
#include "support/gloo_ranks.h"
#include "zero_test_support.h"

namespace krab::parallel::zero {
namespace {

using zero_test::optimizer_of;

struct Case {
  std::string model = "mlp";  // mlp | gpt
  std::string optimizer = "adam";
  int world = 2;
  int stage = 3;  // 0 = DataParallelEngine
  int accum = 1;
  int steps = 3;
  int prefetch = 1;
  bool checkpointing = false;
  std::string compression = "none";  // none | fp16 (min_numel 64)
};

std::shared_ptr<models::Model> make(const Case& c) { return zero_test::small_model(c.model, 11); }

std::pair<at::Tensor, at::Tensor> batch(const Case& c, int64_t step, int64_t m, int rank) {
  auto g = at::detail::createCPUGenerator(1000 + 100 * step + 10 * m + rank);
  if (c.model == "gpt") {
    auto x = at::randint(0, 29, {3, 8}, g, at::kLong);
    return {x, at::randint(0, 29, {3, 8}, g, at::kLong)};
  }
  return {at::randn({6, 13}, g), at::randint(0, 5, {6}, g, at::kLong)};
}

compress::CompressionOptions compression_of(const Case& c) {
  compress::CompressionOptions o;
  o.kind = compress::parse_compressor(c.compression);
  o.min_numel = 64;
  return o;
}

std::unique_ptr<engine::Engine> make_engine(const Case& c, std::unique_ptr<comm::Communicator> g) {
  DataParallelEngineOptions dpo;
  dpo.total_steps = c.steps;
  dpo.global_micro_batch = 6 * c.world;
  if (c.stage == 0)
    return std::make_unique<DataParallelEngine>(make(c), std::move(g), dpo,
                                                make_compression_hook(compression_of(c)),
                                                optimizer_of(c.optimizer));
  Stage3EngineOptions o;
  o.compression = compression_of(c);
  o.prefetch = c.prefetch;
  o.activation_checkpointing = c.checkpointing;
  o.data_parallel = dpo;
  return std::make_unique<Stage3Engine>(make(c), std::move(g), o, optimizer_of(c.optimizer));
}

struct Outcome {
  std::vector<at::Tensor> first_grads;  // stage 0: every .grad; stage 3: the grad shards
  at::Tensor params;                    // flattened, named_parameters order
  comm::TrafficStats step_traffic;      // the last step's
};

void one_step(const Case& c, engine::Engine& e, int rank, const engine::StepPlan& plan,
              Outcome* out) {
  auto& model = e.model();
  for (int m = 0; m < c.accum; ++m) {
    e.before_backward(m, m == c.accum - 1);
    auto [x, y] = batch(c, plan.step, m, rank);
    auto loss = model.loss(model.forward(x), y);
    (c.accum > 1 ? loss / static_cast<double>(c.accum) : loss).backward();
  }
  e.reduce_gradients();
  if (plan.step == 0) {
    if (auto* z = dynamic_cast<Stage3Engine*>(&e)) {
      for (int u = 0; u < z->layout().num_units(); ++u) {
        const at::Tensor& g = z->reducer().grad_shard(u);
        out->first_grads.push_back(g.defined() ? g.clone() : torch::zeros({0}));
      }
    } else {
      for (auto& p : model.parameters()) out->first_grads.push_back(p.grad().clone());
    }
  }
  e.apply(c.optimizer == "adam" ? 0.002 : 0.05);
  e.after_step(plan);
}

// Every parameter whole, flattened: a stage-3 engine gathers each unit for it (collective).
at::Tensor whole_params(engine::Engine& e) {
  std::vector<at::Tensor> v;
  if (auto* z = dynamic_cast<Stage3Engine*>(&e))
    z->visit_parameters([&](const std::string&, const at::Tensor& t) {
      v.push_back(t.detach().reshape({-1}).clone());
    });
  else
    for (auto& p : e.model().parameters()) v.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(v, 0);
}

std::vector<Outcome> train(const Case& c) {
  std::vector<Outcome> out(c.world);
  testing::run_gloo_ranks_owned(c.world, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(c, std::move(g));
    while (auto plan = e->next_step()) {
      const auto before = e->group()->traffic();
      one_step(c, *e, r, *plan, &out[r]);
      e->settle();
      const auto after = e->group()->traffic();
      for (size_t k = 0; k < after.bytes_sent.size(); ++k) {
        out[r].step_traffic.bytes_sent[k] = after.bytes_sent[k] - before.bytes_sent[k];
        out[r].step_traffic.ops[k] = after.ops[k] - before.ops[k];
      }
    }
    out[r].params = whole_params(*e);
  });
  return out;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

// The stage-3 layout of the case's model: every unit candidate a unit.
engine::ShardLayout layout_of(const Case& c) {
  auto model = make(c);
  std::vector<engine::ParamShape> shapes;
  for (const auto& item : model->named_parameters())
    shapes.push_back({item.key(), item.value().sizes().vec()});
  const auto candidates = model->unit_candidates();
  return engine::plan_layout(plan_units(shapes, candidates, candidates), c.world, 16);
}

// Stage 0's full gradients cut as the stage-3 engine shards them.
std::vector<at::Tensor> expected_shards(const Case& c, const std::vector<at::Tensor>& full,
                                        int rank) {
  auto model = make(c);
  std::map<std::string, at::Tensor> by_name;
  size_t i = 0;
  for (const auto& item : model->named_parameters()) by_name[item.key()] = full[i++];
  const auto layout = layout_of(c);
  std::vector<at::Tensor> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    at::Tensor flat = torch::zeros(at::IntArrayRef{layout.unit(u).padded});
    for (const auto& span : layout.unit(u).params)
      flat.narrow(0, span.offset, span.numel).copy_(by_name[span.name].reshape({-1}));
    const auto r = layout.shard(u, rank);
    out.push_back(flat.narrow(0, r.begin, r.size()));
  }
  return out;
}

void expect_matches_stage0(Case c, double tolerance) {
  Case ref_case = c;
  ref_case.stage = 0;
  ref_case.checkpointing = false;
  const auto ref = train(ref_case);
  const auto got = train(c);
  for (int r = 0; r < c.world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto want = expected_shards(c, ref[r].first_grads, r);
    ASSERT_EQ(want.size(), got[r].first_grads.size());
    for (size_t u = 0; u < want.size(); ++u) {
      if (tolerance == 0) {
        EXPECT_TRUE(torch::equal(got[r].first_grads[u], want[u])) << "unit " << u;
      } else if (want[u].numel() > 0) {
        EXPECT_LE(max_rel_diff(got[r].first_grads[u], want[u]), tolerance) << "unit " << u;
      }
    }
    if (tolerance == 0)
      EXPECT_TRUE(torch::equal(got[r].params, ref[r].params));
    else
      EXPECT_LE(max_rel_diff(got[r].params, ref[r].params), tolerance);
    EXPECT_TRUE(torch::equal(got[r].params, got[0].params));
  }
}

TEST(ZeroStage3, TwoRanksAreBitIdenticalToDataParallel) {
  for (const char* model : {"mlp", "gpt"})
    for (const char* opt : {"adam", "sgd"}) {
      SCOPED_TRACE(std::string(model) + " " + opt);
      Case c;
      c.model = model;
      c.optimizer = opt;
      expect_matches_stage0(c, 0);
    }
}

// Activation checkpointing inside the gathers (the recompute finds its unit gathered), and no
// prefetch at all: the same bits.
TEST(ZeroStage3, CheckpointingAndNoPrefetchAreBitIdentical) {
  Case c;
  c.model = "gpt";
  c.checkpointing = true;
  expect_matches_stage0(c, 0);
  c.checkpointing = false;
  c.prefetch = 0;
  expect_matches_stage0(c, 0);
}

// Stage 3 reduces every micro-batch (as stage 2): within 1e-5 with accumulation; four ranks
// add in another order than the ring all-reduce: within 1e-5 after ten steps.
TEST(ZeroStage3, AccumulationAndFourRanksMatchDataParallelAfterTenSteps) {
  Case c;
  c.steps = 10;
  c.accum = 2;
  c.optimizer = "sgd";
  expect_matches_stage0(c, 1e-5);
  c.world = 4;
  c.model = "gpt";
  c.optimizer = "adam";
  c.checkpointing = true;
  expect_matches_stage0(c, 1e-5);
  c.accum = 1;
  c.checkpointing = false;
  c.optimizer = "sgd";
  expect_matches_stage0(c, 1e-5);
}

TEST(ZeroStage3, Fp16CompressionMatchesStageZeroWithFp16) {
  Case c;
  c.compression = "fp16";
  c.steps = 4;
  expect_matches_stage0(c, 0);
}

// memory_model.h's zero_traffic() for stage 3, from the communicator's meter: per micro-batch
// two all-gathers and a reduce-scatter per unit but one gather for the last unit, the root's
// reduce-scatter per micro-batch and its gather once per step.
TEST(ZeroStage3, TrafficPerStepIsTheClosedForm) {
  for (int accum : {1, 2}) {
    Case c;
    c.model = "gpt";
    c.world = 3;
    c.accum = accum;
    c.steps = 2;
    const auto got = train(c);
    MemoryInputs in;
    const auto layout = layout_of(c);
    for (const auto& u : layout.units()) in.unit_numel.push_back(u.numel);
    in.world_size = c.world;
    in.stage = 3;
    in.micro_batches = accum;
    const auto want = zero_traffic(in);
    for (int r = 0; r < c.world; ++r) {
      SCOPED_TRACE("accum " + std::to_string(accum) + " rank " + std::to_string(r));
      // gpt has no buffers: nothing else is sent.
      EXPECT_EQ(got[r].step_traffic.bytes_sent, want.bytes_sent);
      EXPECT_EQ(got[r].step_traffic.ops, want.ops);
    }
  }
}

// Between steps every non-root unit's storage holds 0 bytes (the parameters keep their shapes),
// the root's is whole; memory() is the closed form's 16Ψp/N model state with Adam, and the most
// flats alive at once are the root and two units (the running one and the prefetched one).
TEST(ZeroStage3, UnitsAreFreedBetweenStepsAndMemoryIsTheClosedForm) {
  Case c;
  c.model = "gpt";
  c.world = 3;
  testing::run_gloo_ranks_owned(c.world, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(c, std::move(g));
    auto& z = dynamic_cast<Stage3Engine&>(*e);
    Outcome ignored;
    while (auto plan = e->next_step()) {
      one_step(c, *e, r, *plan, &ignored);
      e->settle();
      for (int u = 1; u < z.layout().num_units(); ++u)
        EXPECT_EQ(z.storage().flat(u).storage().nbytes(), 0u) << "unit " << u;
      EXPECT_EQ(z.storage().flat(0).storage().nbytes(), z.layout().unit(0).padded * 4u);
    }
    const auto named = e->model().named_parameters();
    EXPECT_EQ(named["blocks.0.attn.qkv.weight"].storage().nbytes(), 0u);
    EXPECT_EQ(named["blocks.0.attn.qkv.weight"].sizes(), at::IntArrayRef({72, 24}));
    MemoryInputs in;
    int64_t padded_total = 0, largest = 0;
    for (const auto& u : z.layout().units()) {
      in.unit_numel.push_back(u.numel);
      padded_total += u.padded;
      if (!u.name.empty()) largest = std::max(largest, u.padded);
    }
    in.world_size = c.world;
    in.stage = 3;
    const auto want = predict_memory(in);
    const auto got = e->memory();
    EXPECT_EQ(got.params, want.params);
    EXPECT_EQ(got.grads, want.grads);
    EXPECT_EQ(got.optimizer, want.optimizer);
    EXPECT_EQ(got.params + got.grads + got.optimizer, 16 * padded_total / c.world);
    EXPECT_EQ(z.storage().peak_bytes(), 4 * (z.layout().unit(0).padded + 2 * largest));
  });
}

// The flats' bytes come from the storage's pool (flat_pool.h): the first step maps the blocks,
// every later gather reuses one (no new mapping), the pool holds no more than the flats once
// needed at once, and a freed unit's parameters still hold no bytes (a read fails at once).
TEST(ZeroStage3, GathersAfterTheFirstStepReuseThePoolsBlocks) {
  Case c;
  c.model = "gpt";
  c.steps = 4;
  testing::run_gloo_ranks_owned(c.world, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(c, std::move(g));
    auto& z = dynamic_cast<Stage3Engine&>(*e);
    const FlatPool& pool = z.storage().pool();
    Outcome ignored;
    int64_t after_first = -1;
    while (auto plan = e->next_step()) {
      one_step(c, *e, r, *plan, &ignored);
      e->settle();
      if (after_first < 0) after_first = pool.mappings();
      EXPECT_EQ(pool.mappings(), after_first) << "step " << plan->step;
      EXPECT_EQ(pool.in_use_bytes(), 0) << "the root is not the pool's";
      EXPECT_LE(pool.kept_bytes(), pool.peak_in_use_bytes());
      for (int u = 1; u < z.layout().num_units(); ++u)
        EXPECT_EQ(z.storage().flat(u).storage().data(), nullptr) << "unit " << u;
    }
    // Two blocks at once at most, as the flats (UnitsAreFreedBetweenSteps...): whole pages each.
    int64_t largest = 0;
    for (const auto& u : z.layout().units())
      if (!u.name.empty()) largest = std::max(largest, u.padded * 4);
    EXPECT_GT(after_first, 0);
    EXPECT_LE(pool.peak_in_use_bytes(), 2 * (largest + 4096));
    EXPECT_GE(z.storage().held_peak_bytes(), z.storage().peak_bytes());
    EXPECT_LE(z.storage().held_peak_bytes(), 4 * z.layout().unit(0).padded + 2 * (largest + 4096));
    EXPECT_EQ(e->memory().working_set_peak,
              z.storage().held_peak_bytes() + z.reducer().peak_bucket_bytes());
  });
}

// Evaluation (no gradients): the same logits as stage 0's model, and every unit freed after.
TEST(ZeroStage3, ForwardWithoutGradientsEqualsStageZeroAndFreesEveryUnit) {
  Case c;
  c.model = "gpt";
  std::vector<at::Tensor> want(2), got(2);
  for (int stage : {0, 3}) {
    c.stage = stage;
    testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
      auto e = make_engine(c, std::move(g));
      torch::NoGradGuard no_grad;
      at::Tensor y = e->model().forward(batch(c, 0, 0, r).first);
      (stage == 0 ? want : got)[r] = y;
      if (auto* z = dynamic_cast<Stage3Engine*>(e.get())) {
        for (int u = 1; u < z->layout().num_units(); ++u)
          EXPECT_EQ(z->storage().flat(u).storage().nbytes(), 0u);
      }
    });
  }
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(got[r], want[r]));
}

// state() hands out the master shards and their optimizers; a restore writes into them and
// after_restore() gathers the root; the other units are gathered from the masters when they run.
TEST(ZeroStage3, StateIsTheMasterShardsAndRestoreReachesTheParameters) {
  Case c;
  c.model = "gpt";
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(c, std::move(g));
    auto& z = dynamic_cast<Stage3Engine&>(*e);
    const auto s = e->state();
    ASSERT_NE(s.sharded, nullptr);
    EXPECT_EQ(s.optimizer, nullptr);
    EXPECT_EQ(s.sharded->stage, 3);
    ASSERT_EQ(static_cast<int>(s.sharded->values.size()), z.layout().num_units());
    for (int u = 0; u < z.layout().num_units(); ++u) {
      const at::Tensor& v = s.sharded->values[u];
      EXPECT_EQ(v.data_ptr(), z.storage().master(u).data_ptr());
      torch::NoGradGuard ng;
      const auto range = z.layout().shard(u, r);
      v.copy_(torch::arange(range.begin, range.end, torch::kFloat));  // value = flat index
    }
    e->after_restore();
    EXPECT_TRUE(torch::equal(z.storage().flat(0),
                             torch::arange(0, z.layout().unit(0).padded, torch::kFloat)));
    std::map<std::string, at::Tensor> seen;
    z.visit_parameters(
        [&](const std::string& name, const at::Tensor& t) { seen[name] = t.clone(); });
    for (int u = 0; u < z.layout().num_units(); ++u)
      for (const auto& span : z.layout().unit(u).params)
        EXPECT_TRUE(
            torch::equal(seen[span.name].reshape({-1}),
                         torch::arange(span.offset, span.offset + span.numel, torch::kFloat)))
            << span.name;
  });
}

// Builds as if alone in the process: thread-ranks share torch's one generator, so each rank's
// draws are fenced off (a lock while it draws) and continue from its own generator state, the
// one a process building this model alone would have. Between announcements the builder
// broadcasts (collective), so the lock is released around it. Also checks, at each block's
// announcement, that the blocks announced before it hold 0 bytes: the model is never whole.
class AloneObserver : public models::BuildObserver {
 public:
  AloneObserver(std::mutex& mu, models::BuildObserver& inner, uint64_t seed)
      : inner_(inner), lock_(mu) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_current_seed(seed);
  }
  void on_unit_built(const std::string& path, torch::nn::Module& module) override {
    for (const auto* earlier : blocks_)
      for (const auto& p : earlier->parameters()) EXPECT_EQ(p.storage().nbytes(), 0u) << path;
    if (!path.empty()) blocks_.push_back(&module);
    state_ = at::detail::getDefaultCPUGenerator().get_state();
    lock_.unlock();
    inner_.on_unit_built(path, module);
    lock_.lock();
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(state_);
  }
  int announced() const { return static_cast<int>(blocks_.size()); }

 private:
  models::BuildObserver& inner_;
  std::unique_lock<std::mutex> lock_;
  at::Tensor state_;
  std::vector<const torch::nn::Module*> blocks_;
};

models::ModelSpec gpt_spec(int layers) {
  models::ModelSpec s;
  s.name = "gpt";
  s.input_shape = {8};
  s.num_classes = 29;
  s.layers = layers;
  s.width = 24;
  s.heads = 2;
  s.context = 8;
  return s;
}

// Sharded construction (design §3.4): gpt announces each block once it is initialised and the
// builder adopts it at once, so no two blocks ever hold their bytes together, and the unit
// flats alive at once never exceed one block or the root. The result equals building the model
// whole (the same seed, in a process of its own) and sharding it afterwards.
TEST(ZeroStage3, ShardedConstructionHoldsOneUnitAtATimeAndEqualsWholeConstruction) {
  const int layers = 4;
  torch::Tensor want;
  {
    torch::manual_seed(5);
    auto whole = models::make_model(gpt_spec(layers));
    std::vector<at::Tensor> v;
    for (auto& p : whole->parameters()) v.push_back(p.detach().reshape({-1}).clone());
    want = torch::cat(v);
  }
  std::mutex mu;
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    Stage3EngineOptions o;
    o.data_parallel.total_steps = 1;
    o.data_parallel.global_micro_batch = 6;
    std::vector<engine::ParamShape> shapes;
    for (const auto& p : models::describe_parameters(gpt_spec(layers)).params)
      shapes.push_back({p.name, p.shape});
    std::vector<std::string> blocks;
    for (int i = 0; i < layers; ++i) blocks.push_back("blocks." + std::to_string(i));
    const auto layout = plan_stage3_layout(shapes, blocks, o, g->size());
    Stage3Builder builder(layout, *g);
    std::shared_ptr<models::Model> model;
    {
      AloneObserver alone(mu, builder, 5);
      model = models::make_model(gpt_spec(layers), &alone);
      EXPECT_EQ(alone.announced(), layers);
    }
    int64_t largest = 0;
    for (const auto& u : layout.units()) largest = std::max(largest, u.padded);
    EXPECT_EQ(builder.peak_bytes(), 4 * largest);
    Stage3Engine e(model, std::move(g), o, optimizer_of("adam"), builder.take_storage());
    EXPECT_TRUE(torch::equal(whole_params(e), want)) << "rank " << r;
  });
}

}  // namespace
}  // namespace krab::parallel::zero
