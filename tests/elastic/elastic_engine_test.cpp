// The elastic engine (elastic/elastic_engine.h) on thread-ranks joined by loopback Gloo over
// FileStores, as one machine's launcher hosts them; the test plays the keeper, publishing the
// generation records itself. A rank "dies" by leaving its loop and destroying its engine (its
// sockets close, as a killed process's do); the survivors must recover in place and end where
// one process training on the whole global batch ends (the determinism contract, §5.2).
#include "elastic/elastic_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "../parallel/zero_test_support.h"
#include "core/errors.h"
#include "core/flat.h"
#include "elastic/membership_view.h"
#include "models/model.h"
#include "parallel/zero/stage3_engine.h"
#include "parallel/zero/zero_engine.h"
#include "train/checkpoint.h"
#include "train/live_reshard.h"
#include "train/peer_state.h"

namespace krab::elastic {
namespace {

using namespace std::chrono_literals;
using parallel::zero::zero_test::optimizer_of;
using parallel::zero::zero_test::small_model;

constexpr int64_t kSteps = 10;
constexpr int64_t kBatch = 12;  // the global batch: 3 per rank on 4, 4 per rank on 3
constexpr double kLr = 0.05;

// A directory of FileStores: the control store (also generation 0's group) and one file per
// later generation, as the launcher's private directory holds them.
struct Stores {
  std::filesystem::path dir;
  std::vector<std::unique_ptr<comm::StoreServer>> servers;  // one per generation, as the keeper's
  comm::StorePtr control;
  Stores() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = std::filesystem::temp_directory_path() /
          ("krab-elastic-" + std::to_string(::getpid()) + "-" + test->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    host(0);
    control = comm::connect_store(endpoint(0), 10s);
  }
  ~Stores() {
    control.reset();
    servers.clear();
    std::filesystem::remove_all(dir);
  }
  void host(int64_t g) { servers.push_back(std::make_unique<comm::StoreServer>(endpoint(g))); }
  std::string file(int64_t g) const {
    return (dir / ("g" + std::to_string(g) + ".store")).string();
  }
  comm::Endpoint endpoint(int64_t g) const { return {"127.0.0.1", 0, file(g), ""}; }
};

// Generation g of `slots` (by default 0..workers-1), ranked in that order.
GenerationRecord record_of(Stores& stores, int64_t g, int workers, RecordState state,
                           const std::vector<LostMember>& lost, std::vector<int> slots = {}) {
  GenerationRecord r;
  r.generation = g;
  if (g > 0) stores.host(g);
  if (slots.empty())
    for (int i = 0; i < workers; ++i) slots.push_back(i);
  for (int i = 0; i < workers; ++i) r.members.push_back({i, 0, i, 0, {0, slots[i], 0}});
  r.store = "file " + (g == 0 ? stores.file(0) : stores.file(g));
  r.kind = g == 0 ? RecordKind::kProposal : RecordKind::kAbort;
  r.reason = g == 0 ? "start" : "death";
  r.lost = lost;
  r.decided_at_ms = 1765000000000 + g;
  r.state = state;
  return r;
}

// The data of every step: kBatch examples of the small MLP (13 inputs, 5 classes).
struct Data {
  std::vector<at::Tensor> x, y;
  Data() {
    torch::manual_seed(7);
    for (int64_t s = 0; s < kSteps; ++s) {
      x.push_back(torch::randn({kBatch, 13}));
      y.push_back(torch::randint(0, 5, {kBatch}, torch::kLong));
    }
  }
};

std::unique_ptr<comm::Communicator> join_first(const Stores& stores, int rank, int size) {
  comm::WorldInfo w;
  w.rank = rank;
  w.size = size;
  w.rendezvous = stores.endpoint(0);
  comm::Options o;
  o.timeout = 20s;
  o.abortable = true;
  return comm::make_communicator("gloo", w, o);
}

// How a rank takes part: from the start, or as a joiner (no group: it asks to join and waits
// to be admitted); `leave_after` > 0: it asks to leave (as SIGTERM would) after that many steps.
struct Role {
  bool joining = false;
  int leave_after = 0;
  int zero_stage = 0;  // 1 or 2: ZeRO with replicated shards, resharded live at every change
};

// What train/engines.cpp builds for ZeRO: a later generation's engine is filled from the
// previous generation's shards and wards (train/live_reshard.h), then gathers.
std::unique_ptr<engine::Engine> zero_engine(std::shared_ptr<models::Model> model,
                                            std::unique_ptr<comm::Communicator> group, int stage,
                                            bool initial) {
  parallel::DataParallelEngineOptions dpo;
  dpo.total_steps = kSteps;
  dpo.global_micro_batch = kBatch;
  if (stage == 3) {
    parallel::zero::Stage3EngineOptions so;
    so.replicate_shards = true;
    so.broadcast_initial_state = initial;
    so.data_parallel = dpo;
    return std::make_unique<parallel::zero::Stage3Engine>(model, std::move(group), so,
                                                          optimizer_of("sgd"));
  }
  parallel::zero::ZeroEngineOptions zo;
  zo.stage = stage;
  zo.replicate_shards = true;
  zo.broadcast_initial_state = initial;
  zo.data_parallel = dpo;
  return std::make_unique<parallel::zero::ZeroEngine>(model, std::move(group), zo,
                                                      optimizer_of("sgd"));
}

engine::ShardLayout layout_of(models::Model& model, int stage, int world) {
  if (stage < 3) return parallel::zero::plan_zero_layout(model, "auto", world, 16);
  std::vector<engine::ParamShape> shapes;
  for (const auto& item : model.named_parameters())
    shapes.push_back({item.key(), item.value().sizes().vec()});
  return parallel::zero::plan_stage3_layout(shapes, model.unit_candidates(), {}, world);
}

InnerEngineFactory zero_generations(std::shared_ptr<models::Model> model, int stage) {
  return [model, stage](std::unique_ptr<comm::Communicator> group,
                        const InnerEntry& entry) -> std::unique_ptr<engine::Engine> {
    auto e = zero_engine(model, std::move(group), stage, entry.initial);
    if (entry.initial) return e;
    engine::TrainState before;
    if (entry.previous != nullptr) before = entry.previous->state();
    train::CheckpointMeta meta{entry.step, "mlp", train::model_signature(*model), kBatch, 0};
    train::reshard_live(
        *e->group(), entry.previous != nullptr ? &before : nullptr, e->state(),
        [&](int world) { return layout_of(*model, stage, world); }, meta);
    e->after_restore();
    return e;
  };
}

std::unique_ptr<ElasticEngine> make_engine(const Stores& stores, int rank, int size,
                                           std::shared_ptr<models::Model> model, Role role = {}) {
  ElasticEngineOptions o;
  o.self = MemberId{0, rank, 0};
  o.control = comm::connect_store(stores.endpoint(0), 10s);
  o.backend = "gloo";
  o.comm.timeout = 20s;
  o.wait_s = 20;
  o.leave_requested = [steps = std::make_shared<int>(0), role] {
    return role.leave_after > 0 && ++*steps >= role.leave_after;
  };
  // What train/engines.cpp builds for data parallel: the previous optimizer adopted; rank 0's
  // replica, encoded as a checkpoint, to joiners; rank 0's buffers.
  InnerEngineFactory inner = [model](std::unique_ptr<comm::Communicator> group,
                                     const InnerEntry& entry) -> std::unique_ptr<engine::Engine> {
    parallel::DataParallelEngineOptions dpo;
    dpo.total_steps = kSteps;
    dpo.global_micro_batch = kBatch;
    dpo.data_parallel.broadcast_initial_state = entry.initial;
    std::unique_ptr<torch::optim::Optimizer> adopted;
    if (entry.previous != nullptr)
      adopted = dynamic_cast<parallel::DataParallelEngine&>(*entry.previous).take_optimizer();
    auto e = std::make_unique<parallel::DataParallelEngine>(
        model, std::move(group), dpo, nullptr, optimizer_of("sgd"), std::move(adopted));
    if (entry.initial) return e;
    if (entry.joiners) {
      train::CheckpointMeta meta{entry.step, "mlp", train::model_signature(*model), kBatch, 0};
      train::transfer_replica(*e->group(), e->state(), meta, entry.joining);
    }
    e->broadcast_buffers();
    return e;
  };
  if (role.zero_stage > 0) inner = zero_generations(model, role.zero_stage);
  return std::make_unique<ElasticEngine>(
      o, inner, role.joining ? nullptr : join_first(stores, rank, size), 0);
}

struct Outcome {
  at::Tensor params;
  std::vector<nlohmann::json> changes;
  std::vector<int64_t> unended;  // unended_step() after each change
  std::string error;
};

// The loop of train/trainer.cpp, reduced to what the engine sees: recover() after a broken
// group, then on from the first uncommitted step. Returns early (a "death") at `leave_at`;
// `after` runs after each step. `unended_at_recover`: this rank tells recover() it did not
// end the steps from that one on (the loop's end of step, cut short by the failure).
// `before_recover` runs before each recover() call.
Outcome train(ElasticEngine& engine, const Data& data, int64_t leave_at = -1,
              const std::function<void(int64_t)>& after = nullptr, int64_t unended_at_recover = -1,
              const std::function<void()>& before_recover = nullptr) {
  Outcome out;
  models::Model& model = engine.model();
  int64_t ended = 0;
  for (;;) {
    std::string cause;
    try {
      while (auto plan = engine.next_step()) {
        if (plan->step == leave_at) return out;
        const auto x = data.x[plan->step].slice(0, plan->slice.begin, plan->slice.end);
        const auto y = data.y[plan->step].slice(0, plan->slice.begin, plan->slice.end);
        engine.before_backward(0, true);
        at::Tensor loss = model.training_loss(x, y);
        if (plan->weight != 1.0) loss = loss * plan->weight;
        loss.backward();
        engine.after_compute(0.001);
        engine.reduce_gradients();
        engine.apply(kLr);
        engine.after_step(*plan);
        if (after) after(plan->step);
        ended = plan->step + 1;
      }
      // ZeRO: the last step's gathers may still be in flight; stage 3 holds the parameters
      // only while every unit is gathered (collective).
      engine.settle();
      engine.with_whole_model([&] { out.params = core::flatten(model.parameters()).clone(); });
      return out;
    } catch (const PeerLost& e) {
      cause = e.what();
    }
    try {
      if (unended_at_recover >= 0) ended = std::min(ended, unended_at_recover);
      if (before_recover) before_recover();
      out.changes.push_back(engine.recover(cause, ended));
      if (out.changes.back().value("left", false)) return out;
      out.unended.push_back(engine.unended_step());
      EXPECT_EQ(engine.unended_step(), -1) << "unended_step() answers once";
    } catch (const Error& e) {
      out.error = e.what();
      return out;
    }
  }
}

// One process on the whole global batch: what every elastic run must end at.
at::Tensor reference(const Data& data) {
  auto model = small_model("mlp", 3);
  auto opt = optimizer_of("sgd")(model->parameters());
  for (int64_t s = 0; s < kSteps; ++s) {
    model->training_loss(data.x[s], data.y[s]).backward();
    for (auto& g : opt->param_groups()) g.options().set_lr(kLr);
    opt->step();
    opt->zero_grad();
  }
  return core::flatten(model->parameters());
}

// The run of the two tests below: 4 ranks, rank 3 leaves before step 5 (its engine destroyed:
// its sockets close, as a killed process's do), the keeper publishes generation 1 with ranks
// 0-2. `rank2_unended_at` >= 0: rank 2 tells recover() it did not end the steps from there on.
std::vector<Outcome> lose_rank3_at_step5(const Data& data, int64_t rank2_unended_at = -1) {
  Stores stores;
  publish_record(*stores.control, record_of(stores, 0, 4, RecordState::kRun, {}));
  std::vector<Outcome> outcomes(4);
  std::atomic<bool> gone{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      auto engine = make_engine(stores, r, 4, small_model("mlp", 3));
      outcomes[r] = train(*engine, data, r == 3 ? 5 : -1, nullptr, r == 2 ? rank2_unended_at : -1);
      if (r == 3) {
        engine.reset();
        gone = true;
      }
    });
  while (!gone) std::this_thread::sleep_for(5ms);
  publish_record(*stores.control,
                 record_of(stores, 1, 3, RecordState::kRun, {{{0, 3, 0}, "killed by signal 9"}}));
  for (auto& t : ranks) t.join();
  return outcomes;
}

// Rank 3 of 4 leaves before step 5; the keeper publishes generation 1 with ranks 0-2. The
// survivors rebuild their group in place, lose step 5's work at most, re-split the same global
// batch 4-4-4 and end within float order of one process on the whole batch — and bit-equal to
// each other.
TEST(ElasticEngine, SurvivorsOfALostRankEndOnTheUninterruptedTrajectory) {
  const Data data;
  const std::vector<Outcome> outcomes = lose_rank3_at_step5(data);
  const at::Tensor expected = reference(data);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(outcomes[r].error, "");
    ASSERT_EQ(outcomes[r].changes.size(), 1u);
    const nlohmann::json& change = outcomes[r].changes[0];
    EXPECT_EQ(change["generation"], 1);
    EXPECT_EQ(change["workers"], 3);
    EXPECT_EQ(change["previous_workers"], 4);
    EXPECT_EQ(change["step"], 5);        // steps 0-4 committed everywhere
    EXPECT_EQ(change["lost_steps"], 1);  // step 5 was in flight
    ASSERT_TRUE(outcomes[r].params.defined());
    EXPECT_TRUE(torch::allclose(outcomes[r].params, expected, 1e-5, 1e-6))
        << "max abs diff " << (outcomes[r].params - expected).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(outcomes[r].params, outcomes[0].params));
  }
}

// A failure can cut the loop's end of a committed step (its shared loss, checkpoint,
// evaluation: collectives) short on one rank after others ran it. Rank 2 says it did not end
// step 4; the new group learns it in the reconcile, and every survivor is told to run step 4's
// end again (unended_step() == 4), so the collectives of all match. Without the cut, no one is.
TEST(ElasticEngine, AStepEndCutShortOnOneSurvivorIsRunAgainByAll) {
  for (const bool cut : {true, false}) {
    SCOPED_TRACE(cut ? "rank 2 did not end step 4" : "every survivor ended step 4");
    const Data data;
    const std::vector<Outcome> outcomes = lose_rank3_at_step5(data, cut ? 4 : -1);
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_EQ(outcomes[r].error, "");
      ASSERT_EQ(outcomes[r].unended.size(), 1u);
      EXPECT_EQ(outcomes[r].changes[0]["step"], 5);
      EXPECT_EQ(outcomes[r].unended[0], cut ? 4 : -1);
    }
  }
}

// Waits until the control store holds `key` (a worker's request to the keeper).
void wait_for_key(c10d::Store& store, const std::string& key) {
  while (!store.check({key})) std::this_thread::sleep_for(5ms);
}

// Waits until rank 0 reported `steps` completed steps (elastic/progress).
void wait_for_progress(c10d::Store& store, int64_t steps) {
  for (;;) {
    if (store.check({kProgressKey})) {
      const std::vector<uint8_t> v = store.get(kProgressKey);
      if (std::stoll(std::string(v.begin(), v.end())) >= steps) return;
    }
    std::this_thread::sleep_for(2ms);
  }
}

void expect_on_trajectory(const std::vector<Outcome>& outcomes, const std::vector<int>& ranks,
                          const at::Tensor& expected) {
  for (int r : ranks) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(outcomes[r].error, "");
    ASSERT_TRUE(outcomes[r].params.defined());
    EXPECT_TRUE(torch::allclose(outcomes[r].params, expected, 1e-5, 1e-6))
        << "max abs diff " << (outcomes[r].params - expected).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(outcomes[r].params, outcomes[ranks[0]].params));
  }
}

// A fourth worker joins a run of three: it asks (elastic/join/<member>), the keeper proposes
// generation 1 with it as rank 3, the three finish the step that carried the proposal, and the
// joiner receives rank 0's replica (parameters, momentum) and trains on. No step is lost; all
// four end bit-equal, on the uninterrupted trajectory.
TEST(ElasticEngine, AJoinerReceivesTheStateAndTheRunLosesNoStep) {
  Stores stores;
  const Data data;
  publish_record(*stores.control, record_of(stores, 0, 3, RecordState::kRun, {}));
  std::vector<Outcome> outcomes(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      if (r == 3) wait_for_key(*stores.control, "elastic/progress");  // joins a running job
      // (it may ask before step 3: then the proposal finds the others at step 3 or earlier)
      auto engine = make_engine(stores, r, 3, small_model("mlp", r == 3 ? 99 : 3), {r == 3, 0});
      // The three wait after step 3 until their views have read the proposal, so that the
      // vote of step 4 carries it (ten steps take milliseconds: the run would end first).
      outcomes[r] = train(*engine, data, -1, [&engine](int64_t step) {
        while (step == 3 && engine->newest_seen() < 1) std::this_thread::sleep_for(1ms);
      });
    });
  wait_for_key(*stores.control, std::string(kJoinPrefix) + "0.3.0");
  auto next = record_of(stores, 1, 4, RecordState::kRun, {});
  next.kind = RecordKind::kProposal;
  next.reason = "join";
  publish_record(*stores.control, next);
  for (auto& t : ranks) t.join();
  expect_on_trajectory(outcomes, {0, 1, 2, 3}, reference(data));
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(outcomes[r].changes.size(), 1u);
    EXPECT_EQ(outcomes[r].changes[0]["kind"], "proposal");
    EXPECT_EQ(outcomes[r].changes[0]["lost_steps"], 0);
    EXPECT_EQ(outcomes[r].changes[0]["workers"], 4);
  }
  EXPECT_TRUE(outcomes[3].changes.empty());
}

// Rank 1 of 4 asks to leave after its third step (SIGTERM, §2.4); the keeper proposes
// generation 1 without it; it ends its run at the step the proposal takes effect, and the other
// three go on, renumbered 0-2, with no step lost.
TEST(ElasticEngine, AGracefulLeaveLosesNoStep) {
  Stores stores;
  const Data data;
  publish_record(*stores.control, record_of(stores, 0, 4, RecordState::kRun, {}));
  std::vector<Outcome> outcomes(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      auto engine = make_engine(stores, r, 4, small_model("mlp", 3), {false, r == 1 ? 3 : 0});
      outcomes[r] = train(*engine, data);
    });
  wait_for_key(*stores.control, std::string(kLeavePrefix) + "0.1.0");
  auto next = record_of(stores, 1, 3, RecordState::kRun, {{{0, 1, 0}, "left"}}, {0, 2, 3});
  next.kind = RecordKind::kProposal;
  next.reason = "leave";
  publish_record(*stores.control, next);
  for (auto& t : ranks) t.join();
  expect_on_trajectory(outcomes, {0, 2, 3}, reference(data));
  ASSERT_EQ(outcomes[1].changes.size(), 1u);
  EXPECT_TRUE(outcomes[1].changes[0].value("left", false));
  EXPECT_FALSE(outcomes[1].params.defined());
  EXPECT_EQ(outcomes[0].changes[0]["lost_steps"], 0);
  EXPECT_GE(outcomes[0].changes[0]["step"].get<int64_t>(), 3);
}

// The race of two decisions within one rebuild (elastic_engine.h): rank 3 of 4 dies before
// step 5 and the keeper publishes generation 1 (ranks 0-2). Rank 0 reads it and starts to build
// its group; ranks 1 and 2 are held until the keeper has published generation 2 (the same three:
// a second death's abort, or a rejoin's proposal) and skip straight to it. Generation 1's group
// can never be complete: rank 0 must give it up at once and meet the others in generation 2.
// Everyone ends on the uninterrupted trajectory, far within comm.timeout_s (20 s here), which
// rank 0 would otherwise wait out in generation 1's rendezvous before the run ended.
TEST(ElasticEngine, AGenerationSupersededDuringTheRebuildIsGivenUpByAll) {
  for (const RecordKind kind : {RecordKind::kAbort, RecordKind::kProposal}) {
    SCOPED_TRACE("generation 2 is a " + std::string(kind_name(kind)));
    const auto t0 = std::chrono::steady_clock::now();
    Stores stores;
    const Data data;
    publish_record(*stores.control, record_of(stores, 0, 4, RecordState::kRun, {}));
    std::vector<Outcome> outcomes(4);
    std::atomic<bool> gone{false};
    std::vector<std::thread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        auto engine = make_engine(stores, r, 4, small_model("mlp", 3));
        // Ranks 1 and 2 fail with rank 0 in step 5 (their gradients' all-reduce with the dead
        // rank 3), then wait until their views have read generation 2.
        outcomes[r] = train(*engine, data, r == 3 ? 5 : -1, nullptr, -1, [&engine, r] {
          while ((r == 1 || r == 2) && engine->newest_seen() < 2) std::this_thread::sleep_for(1ms);
        });
        if (r == 3) {
          engine.reset();
          gone = true;
        }
      });
    while (!gone) std::this_thread::sleep_for(5ms);
    const std::vector<LostMember> lost{{{0, 3, 0}, "killed by signal 9"}};
    const GenerationRecord first = record_of(stores, 1, 3, RecordState::kRun, lost);
    // Every client of a FileStore adds to a reference count in its file: the file grows when
    // rank 0, the only one not held, has read generation 1 and opened its store.
    const auto untouched = std::filesystem::file_size(stores.file(1));
    publish_record(*stores.control, first);
    while (std::filesystem::file_size(stores.file(1)) == untouched)
      std::this_thread::sleep_for(1ms);
    GenerationRecord second = record_of(stores, 2, 3, RecordState::kRun, lost);
    second.kind = kind;
    second.reason = kind == RecordKind::kAbort ? "death" : "join";
    publish_record(*stores.control, second);
    for (auto& t : ranks) t.join();

    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "comm.timeout_s is 20 s";
    expect_on_trajectory(outcomes, {0, 1, 2}, reference(data));
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_EQ(outcomes[r].changes.size(), 1u);
      EXPECT_EQ(outcomes[r].changes[0]["generation"], 2);
      EXPECT_EQ(outcomes[r].changes[0]["workers"], 3);
      EXPECT_EQ(outcomes[r].changes[0]["step"], 5);
      EXPECT_EQ(outcomes[r].changes[0]["lost_steps"], 1);
    }
  }
}

// A record that drops this rank ends its run by name; one whose state is `stop` (fewer than
// elastic.min_workers and nobody joined in time) ends every survivor's, naming the key.
TEST(ElasticEngine, AStopRecordEndsTheRunNamingMinWorkers) {
  Stores stores;
  const Data data;
  publish_record(*stores.control, record_of(stores, 0, 2, RecordState::kRun, {}));
  std::vector<Outcome> outcomes(2);
  std::atomic<bool> gone{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto engine = make_engine(stores, r, 2, small_model("mlp", 3));
      outcomes[r] = train(*engine, data, r == 1 ? 2 : -1);
      if (r == 1) {
        engine.reset();
        gone = true;
      }
    });
  while (!gone) std::this_thread::sleep_for(5ms);
  publish_record(*stores.control,
                 record_of(stores, 1, 1, RecordState::kStop, {{{0, 1, 0}, "killed by signal 9"}}));
  for (auto& t : ranks) t.join();
  EXPECT_NE(outcomes[0].error.find("elastic.min_workers"), std::string::npos) << outcomes[0].error;
  EXPECT_NE(outcomes[0].error.find("member 0.1.0 killed by signal 9"), std::string::npos);
}

// ZeRO stages 1-3 with replicated shards (design §4.2-§4.3): rank `dead` of 4 dies before
// step 5; its shard lives on in its buddy (rank dead + 1), and the three survivors reshard the
// committed state into the layout for three — each new shard's elements from whichever
// survivor holds them — and end within float order of one process on the whole batch,
// bit-equal to each other. Then a joiner enters the three (generation 2) and receives its
// shard the same way, from the others' shards alone.
class ElasticZero : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ElasticZero, ALostShardComesBackFromItsBuddyAndAJoinerGetsItsShard) {
  // Plain variables, not a structured binding: the lambdas below capture them (clang 14).
  const int stage = std::get<0>(GetParam());
  const int dead = std::get<1>(GetParam());
  Stores stores;
  const Data data;
  publish_record(*stores.control, record_of(stores, 0, 4, RecordState::kRun, {}));
  std::vector<Outcome> outcomes(5);
  std::atomic<bool> gone{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 5; ++r)
    ranks.emplace_back([&, r] {
      Role role{r == 4, 0, stage};
      // The joiner asks once generation 1 has completed a step (asking earlier, its join
      // could be decided before every survivor read generation 1: they would skip to it, one
      // change instead of the two this test checks; see elastic_engine.h's "Two changes").
      if (r == 4) wait_for_progress(*stores.control, 6);
      auto engine = make_engine(stores, r, 4, small_model("mlp", r == 4 ? 99 : 3), role);
      outcomes[r] = train(*engine, data, r == dead ? 5 : -1, [&engine](int64_t step) {
        // The survivors wait after step 7 until the join proposal is read, so that step 8's
        // vote carries it (ten steps take milliseconds: the run would end first).
        while (step == 7 && engine->generation() == 1 && engine->newest_seen() < 2)
          std::this_thread::sleep_for(1ms);
      });
      if (r == dead) {
        engine.reset();
        gone = true;
      }
    });
  while (!gone) std::this_thread::sleep_for(5ms);
  std::vector<int> alive;
  for (int r = 0; r < 4; ++r)
    if (r != dead) alive.push_back(r);
  publish_record(*stores.control, record_of(stores, 1, 3, RecordState::kRun,
                                            {{{0, dead, 0}, "killed by signal 9"}}, alive));
  wait_for_key(*stores.control, std::string(kJoinPrefix) + "0.4.0");
  std::vector<int> next = alive;
  next.push_back(4);
  auto join = record_of(stores, 2, 4, RecordState::kRun, {}, next);
  join.kind = RecordKind::kProposal;
  join.reason = "join";
  publish_record(*stores.control, join);
  for (auto& t : ranks) t.join();

  std::vector<int> ended = alive;
  ended.push_back(4);
  expect_on_trajectory(outcomes, ended, reference(data));
  for (int r : alive) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(outcomes[r].changes.size(), 2u);
    EXPECT_EQ(outcomes[r].changes[0]["workers"], 3);
    EXPECT_EQ(outcomes[r].changes[0]["step"], 5);
    EXPECT_EQ(outcomes[r].changes[1]["workers"], 4);
    EXPECT_EQ(outcomes[r].changes[1]["lost_steps"], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ElasticZero,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 2)));

}  // namespace
}  // namespace krab::elastic
