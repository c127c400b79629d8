// The per-unit all-gather wait of ZeRO stages 1-2 (parallel/zero/gather_wait_runner.h) and
// `parallel.wrap: auto` from the model's unit candidates (parallel/zero/plan.h's plan_wrap).
//
// Independent expectations: the wait plan worked out by hand for small layouts; the order in
// which UnitStorage sees its gathers waited, observed from inside the forward (a unit's forward
// must start while a later unit's gather is still unwaited — with everything waited before the
// forward, as before this runner, the test fails); the data-parallel engine (stage 0) driven
// through the same calls, without activation checkpointing, against stages 1-2 with it: on two
// ranks bit for bit (the recompute gives identical gradients, models/recompute.h).
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>

#include "core/errors.h"
#include "parallel/zero/gather_wait_runner.h"
#include "parallel/zero/plan.h"
#include "parallel/zero/zero_engine.h"
#include "support/gloo_ranks.h"
#include "support/script_modules.h"
#include "zero_test_support.h"

namespace krab::parallel::zero {
namespace {

namespace fs = std::filesystem;

// ---- The plan, pure ----------------------------------------------------------------------

engine::ShardLayout layout_of(const std::vector<engine::UnitParams>& units) {
  return engine::plan_layout(units, 2, 16);
}

// gpt's shape with auto: the root (embeddings, ln_f, head) is read outside the blocks, so it is
// waited before the forward and gathered first; each block at its own forward.
TEST(GatherWaitPlan, RootBeforeTheForwardThenEachUnitAtItsCandidate) {
  const auto layout = layout_of({{"", {{"tok_emb.weight", {4, 2}}, {"head.weight", {4, 2}}}},
                                 {"blocks.0", {{"blocks.0.fc.weight", {2, 2}}}},
                                 {"blocks.1", {{"blocks.1.fc.weight", {2, 2}}}}});
  const auto plan = plan_gather_waits(layout, {"blocks.0", "blocks.1"});
  EXPECT_EQ(plan.before_forward, std::vector<int>{0});
  EXPECT_EQ(plan.at_candidate, (std::vector<std::vector<int>>{{1}, {2}}));
  EXPECT_EQ(plan.order, (std::vector<int>{0, 1, 2}));
}

// Units from globs need not be candidates: `blocks` holds both blocks (waited at the first),
// `tok_emb` and `head` are read outside any candidate (before the forward), the empty root has
// no gather, and the gathers go in forward order, not in unit order.
TEST(GatherWaitPlan, GlobUnitsAreWaitedWhereTheForwardFirstReadsThem) {
  const auto layout = layout_of({{"", {}},
                                 {"head", {{"head.weight", {3}}}},
                                 {"blocks", {{"blocks.1.w", {5}}, {"blocks.0.w", {5}}}},
                                 {"tok_emb", {{"tok_emb.weight", {3}}}}});
  const auto plan = plan_gather_waits(layout, {"blocks.0", "blocks.1"});
  EXPECT_EQ(plan.before_forward, (std::vector<int>{1, 3}));
  EXPECT_EQ(plan.at_candidate, (std::vector<std::vector<int>>{{2}, {}}));
  EXPECT_EQ(plan.order, (std::vector<int>{1, 3, 2}));
}

// Candidates in forward order that differs from registration order; a unit inside a candidate
// (wrap `*.fc`) waits at that candidate; a model without candidates waits everything first.
TEST(GatherWaitPlan, ForwardOrderAndUnitsInsideCandidates) {
  const auto layout = layout_of({{"", {}},
                                 {"b.fc", {{"b.fc.w", {3}}}},
                                 {"a.fc", {{"a.fc.w", {3}}}},
                                 {"a.ln", {{"a.ln.w", {3}}}}});
  const auto plan = plan_gather_waits(layout, {"a", "b"});
  EXPECT_TRUE(plan.before_forward.empty());
  EXPECT_EQ(plan.at_candidate, (std::vector<std::vector<int>>{{2, 3}, {1}}));
  EXPECT_EQ(plan.order, (std::vector<int>{2, 3, 1}));
  const auto none = plan_gather_waits(layout, {});
  EXPECT_EQ(none.before_forward, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(none.order, (std::vector<int>{1, 2, 3}));
}

// ---- parallel.wrap: auto -----------------------------------------------------------------

std::vector<engine::ParamShape> trainable_shapes(models::Model& model) {
  std::vector<engine::ParamShape> shapes;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) shapes.push_back({item.key(), item.value().sizes().vec()});
  return shapes;
}

std::vector<std::string> unit_names(const std::vector<engine::UnitParams>& units) {
  std::vector<std::string> out;
  for (const auto& u : units) out.push_back(u.name);
  return out;
}

// A scripted module whose forward order differs from its registration order, with a child
// called in a loop (not a unit candidate: gathered with the root) and a parameter of its own.
torch::jit::Module scripted(test::ScriptBuilder& b) {
  torch::jit::Module root = b.module("Ordered");
  root.register_parameter("stem", torch::randn({6, 6}).requires_grad_(true), false);
  root.register_module("late", b.linear(6, 5));
  root.register_module("looped", b.linear(6, 6));
  root.register_module("early", b.linear(6, 6));
  root.define(R"(
def forward(self, x):
    x = torch.tanh(torch.matmul(x, self.stem))
    x = self.early.forward(x)
    for i in range(2):
        x = self.looped.forward(x)
    return self.late.forward(torch.relu(x))
)");
  return root;
}

class ScriptFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-gwait-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    test::ScriptBuilder b;
    torch::manual_seed(5);
    path_ = (dir_ / "net.ts").string();
    scripted(b).save(path_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::shared_ptr<models::Model> load() const {
    models::ModelSpec spec;
    spec.name = "torchscript";
    spec.path = path_;
    spec.input_shape = {6};
    return models::make_model(spec);
  }
  fs::path dir_;
  std::string path_;
};

TEST_F(ScriptFile, AutoWrapIsTheModelsUnitCandidates) {
  std::map<std::string, std::shared_ptr<models::Model>> nets;
  for (const char* name : {"gpt", "mlp"}) nets[name] = zero_test::small_model(name, 3);
  models::ModelSpec cnn;
  cnn.name = "cnn";
  cnn.input_shape = {1, 8, 8};
  nets["cnn"] = models::make_model(cnn);
  nets["torchscript"] = load();
  const std::map<std::string, std::vector<std::string>> want = {
      {"gpt", {"blocks.0", "blocks.1"}},
      {"mlp", {"fc1", "fc2", "fc3"}},
      {"cnn", {"conv1", "conv2", "fc1", "fc2"}},
      {"torchscript", {"early", "late"}}};  // forward order; `looped` is not split
  for (const auto& [name, model] : nets) {
    SCOPED_TRACE(name);
    ASSERT_EQ(model->unit_candidates(), want.at(name));
    std::vector<std::string> units = {""};
    for (const auto& c : want.at(name)) units.push_back(c);
    const auto shapes = trainable_shapes(*model);
    EXPECT_EQ(unit_names(plan_wrap(shapes, model->unit_candidates(), "auto")), units);
    EXPECT_EQ(wrap_source(model->unit_candidates(), " auto "), "auto: the model's units");
  }
  // The scripted module's root unit holds what runs outside the split: stem and looped.
  const auto ts = plan_wrap(trainable_shapes(*nets["torchscript"]),
                            nets["torchscript"]->unit_candidates(), "auto");
  std::vector<std::string> root;
  for (const auto& p : ts[0].params) root.push_back(p.name);
  EXPECT_EQ(root, (std::vector<std::string>{"stem", "looped.weight", "looped.bias"}));
}

// A model without candidates falls back to every top-level module (`*`), or to the root alone
// when its parameters sit at the top; explicit globs still go over every module path, and one
// that names no module is refused naming parallel.wrap.
TEST(PlanWrap, FallbackAndGlobs) {
  const std::vector<engine::ParamShape> shapes = {
      {"a.w", {2}}, {"a.inner.w", {2}}, {"b.w", {3}}, {"top", {1}}};
  EXPECT_EQ(unit_names(plan_wrap(shapes, {}, "auto")), (std::vector<std::string>{"", "a", "b"}));
  EXPECT_EQ(wrap_source({}, "auto"), "auto: *, the model offers no units");
  EXPECT_EQ(unit_names(plan_wrap({{"w", {2}}}, {}, "auto")), std::vector<std::string>{""});
  EXPECT_EQ(unit_names(plan_wrap(shapes, {"a"}, "a.inner, b")),
            (std::vector<std::string>{"", "a.inner", "b"}));
  EXPECT_EQ(wrap_source({"a"}, "a.inner, b"), "a.inner, b");
  try {
    plan_wrap(shapes, {"a", "b"}, "a, nothing");
    ADD_FAILURE() << "a wrap naming no module was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.wrap: 'nothing' matches no module"),
              std::string::npos)
        << e.what();
  }
}

// ---- The engine ---------------------------------------------------------------------------

using ModelFactory = std::function<std::shared_ptr<models::Model>()>;
// Rank `rank`'s (inputs, targets) for step `step`, deterministic in both.
using BatchOf = std::function<std::pair<at::Tensor, at::Tensor>(int64_t step, int rank)>;

struct Job {
  ModelFactory model;
  BatchOf batch;
  int stage = 1;  // 0: DataParallelEngine
  bool checkpointing = false;
  int steps = 3;
};

BatchOf mlp_batches() {
  return [](int64_t step, int rank) {
    auto g = at::detail::createCPUGenerator(500 + 10 * step + rank);
    return std::make_pair(at::randn({6, 13}, g), at::randint(0, 5, {6}, g, at::kLong));
  };
}

BatchOf gpt_batches() {
  return [](int64_t step, int rank) {
    auto g = at::detail::createCPUGenerator(700 + 10 * step + rank);
    return std::make_pair(at::randint(0, 29, {3, 8}, g, at::kLong),
                          at::randint(0, 29, {3, 8}, g, at::kLong));
  };
}

BatchOf script_batches() {
  return [](int64_t step, int rank) {
    auto g = at::detail::createCPUGenerator(900 + 10 * step + rank);
    return std::make_pair(at::randn({4, 6}, g), at::randint(0, 5, {4}, g, at::kLong));
  };
}

std::unique_ptr<engine::Engine> make_engine(const Job& run, std::unique_ptr<comm::Communicator> g) {
  DataParallelEngineOptions dpo;
  dpo.total_steps = run.steps;
  dpo.global_micro_batch = 12;
  const auto optimizer = zero_test::optimizer_of("adam");
  if (run.stage == 0)
    return std::make_unique<DataParallelEngine>(run.model(), std::move(g), dpo, nullptr, optimizer);
  ZeroEngineOptions zo;
  zo.stage = run.stage;
  zo.activation_checkpointing = run.checkpointing;
  zo.data_parallel = dpo;
  return std::make_unique<ZeroEngine>(run.model(), std::move(g), zo, optimizer);
}

// Put between the model and the engine's runner: counts each candidate's forward calls (two
// per micro-batch when the unit is recomputed in backward) and records, at the first call of
// each candidate while `watch` is on, which units' gathers UnitStorage still has pending.
// Restores the engine's runner when it goes.
class Spy : public models::UnitRunner {
 public:
  Spy(models::Model& model, const UnitStorage& storage)
      : model_(model), storage_(storage), inner_(model.unit_runner()) {
    const size_t n = model.unit_candidates().size();
    calls.assign(n, 0);
    pending_at.resize(n);
    model.set_unit_runner(this, identity());
  }
  ~Spy() override { model_.set_unit_runner(inner_, identity()); }

  at::Tensor run(int unit, const at::Tensor& x, const models::UnitForward& forward) override {
    // By value: a recomputing runner keeps the closure until backward.
    models::UnitForward counted = [this, unit, forward](const at::Tensor& h) {
      ++calls[unit];
      if (watch && pending_at[unit].empty())
        for (int u = 0; u < storage_.num_units(); ++u)
          pending_at[unit].push_back(storage_.pending(u));
      return forward(h);
    };
    return inner_ != nullptr ? inner_->run(unit, x, counted) : counted(x);
  }

  std::vector<int> calls;
  std::vector<std::vector<bool>> pending_at;  // per candidate, per unit
  bool watch = false;

 private:
  std::vector<int> identity() const {
    std::vector<int> ids(calls.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    return ids;
  }
  models::Model& model_;
  const UnitStorage& storage_;
  models::UnitRunner* inner_;
};

struct Outcome {
  at::Tensor params;
  std::vector<int> calls;                     // Spy::calls (ZeRO runs)
  std::vector<std::vector<bool>> pending_at;  // Spy::pending_at at step 1 (ZeRO runs)
};

// The training loop's calls (train/trainer.cpp), one micro-batch per step.
std::vector<Outcome> train(const Job& run) {
  std::vector<Outcome> out(2);
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(run, std::move(g));
    auto* z = dynamic_cast<ZeroEngine*>(e.get());
    std::unique_ptr<Spy> spy;
    if (z != nullptr) spy = std::make_unique<Spy>(e->model(), z->storage());
    while (auto plan = e->next_step()) {
      if (spy) spy->watch = plan->step == 1;  // step 0 starts with nothing to gather
      e->before_backward(0, true);
      auto [x, y] = run.batch(plan->step, r);
      e->model().training_loss(x, y).backward();
      e->reduce_gradients();
      e->apply(0.002);
      e->after_step(*plan);
    }
    e->settle();
    std::vector<at::Tensor> flat;
    for (auto& p : e->model().parameters()) flat.push_back(p.detach().reshape({-1}));
    out[r].params = torch::cat(flat);
    if (spy) {
      out[r].calls = spy->calls;
      out[r].pending_at = spy->pending_at;
    }
  });
  return out;
}

// The forward of the first unit starts while the last unit's gather is still unwaited, and each
// unit is whole (its gather waited) when its own forward starts; the root, read by gpt's
// embeddings before any block, is waited before the forward.
TEST(ZeroGatherWait, TheFirstUnitRunsBeforeTheLastGatherIsWaited) {
  for (const char* name : {"mlp", "gpt"})
    for (int stage : {1, 2}) {
      SCOPED_TRACE(std::string(name) + " stage " + std::to_string(stage));
      Job run;
      run.model = [name] { return zero_test::small_model(name, 11); };
      run.batch = std::string(name) == "gpt" ? gpt_batches() : mlp_batches();
      run.stage = stage;
      const auto got = train(run);
      for (const Outcome& o : got) {
        // Units: the root (empty for the mlp), then one per candidate in forward order.
        const size_t candidates = o.pending_at.size();
        ASSERT_GE(candidates, 2u);
        for (size_t c = 0; c < candidates; ++c) {
          ASSERT_EQ(o.pending_at[c].size(), candidates + 1) << "candidate " << c;
          EXPECT_FALSE(o.pending_at[c][0]) << "root at candidate " << c;
          for (size_t u = 1; u <= candidates; ++u)
            EXPECT_EQ(o.pending_at[c][u], u > c + 1) << "unit " << u << " at candidate " << c;
        }
      }
    }
}

// With model.activation_checkpointing the engine's runner also recomputes (each unit's forward
// runs twice per step) and the result is stage 0's without checkpointing, bit for bit on two
// ranks: mlp and gpt, stages 1 and 2, and a scripted module through its krab::unit_call split.
TEST_F(ScriptFile, CheckpointingThroughTheRunnerIsBitIdenticalToDataParallel) {
  struct Model {
    const char* name;
    ModelFactory make;
    BatchOf batch;
    size_t candidates;
  };
  const std::string path = path_;
  const std::vector<Model> cases = {
      {"mlp", [] { return zero_test::small_model("mlp", 11); }, mlp_batches(), 3},
      {"gpt", [] { return zero_test::small_model("gpt", 11); }, gpt_batches(), 2},
      {"torchscript", [this] { return load(); }, script_batches(), 2}};
  for (const Model& m : cases) {
    Job run;
    run.model = m.make;
    run.batch = m.batch;
    run.stage = 0;
    const auto want = train(run);
    for (int stage : {1, 2}) {
      SCOPED_TRACE(std::string(m.name) + " stage " + std::to_string(stage));
      run.stage = stage;
      run.checkpointing = true;
      const auto got = train(run);
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(torch::equal(got[r].params, want[r].params)) << "rank " << r;
        EXPECT_EQ(got[r].calls.size(), m.candidates);
        for (int calls : got[r].calls) EXPECT_EQ(calls, 2 * run.steps);
      }
    }
  }
}

}  // namespace
}  // namespace krab::parallel::zero
