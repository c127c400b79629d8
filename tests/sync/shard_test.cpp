// The parameter-server shard's state machine (sync/shard.h), without transport: the update
// rules against closed forms and a reference optimizer, the staleness bound, liveness, and
// bad input.
#include "sync/shard.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "core/errors.h"

namespace krab::sync {
namespace {

using namespace std::chrono_literals;

OptimizerFactory sgd(double lr, double momentum = 0) {
  return [=](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(p),
                                               torch::optim::SGDOptions(lr).momentum(momentum));
  };
}

ShardOptions options(int workers, int s, double lr = 0.1,
                     std::chrono::milliseconds timeout = 10000ms) {
  ShardOptions o;
  o.workers = workers;
  o.max_staleness = s;
  o.worker_timeout = timeout;
  o.lr_at = [lr](int64_t) { return lr; };
  return o;
}

at::Tensor as_tensor(const std::string& bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size() / 4)}, at::kFloat);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// A deterministic gradient for worker w at step k.
at::Tensor grad_of(int w, int64_t k, int64_t n) {
  return torch::sin(torch::arange(n, at::kFloat) * (0.37 * (w + 1)) + 0.11 * k) * (1 + 0.5 * w);
}

ShardState::Step push(int w, int64_t clock, const at::Tensor& g, int64_t base = 0) {
  ShardState::Step s;
  s.worker = w;
  s.clock = clock;
  s.grad = g.data_ptr<float>();
  s.grad_numel = g.numel();
  s.base_version = base;
  return s;
}

ShardState::Step pull(int w, int64_t clock) {
  ShardState::Step s;
  s.worker = w;
  s.clock = clock;
  return s;
}

const std::function<bool()> kNever = [] { return false; };

TEST(ShardRange, ContiguousBalancedAndCovering) {
  for (int64_t total : {0, 1, 7, 100, 1001})
    for (int servers : {1, 2, 3, 8}) {
      int64_t next = 0, lo = INT64_MAX, hi = 0;
      for (int i = 0; i < servers; ++i) {
        const ShardRange r = shard_range(total, i, servers);
        EXPECT_EQ(r.offset, next) << total << "/" << servers << " shard " << i;
        next += r.numel;
        lo = std::min(lo, r.numel);
        hi = std::max(hi, r.numel);
      }
      EXPECT_EQ(next, total);
      EXPECT_LE(hi - lo, 1);
    }
  EXPECT_THROW(shard_range(10, 2, 2), Error);
}

// s < 0: every push is applied on arrival as a 1/W step: x = x0 - (lr / W) * sum of pushes.
TEST(Shard, PureAsyncAppliesEachPushAsAFractionOfAStep) {
  const at::Tensor x0 = torch::linspace(-1, 1, 5);
  ShardState shard(options(2, -1, 0.1), x0, sgd(0.1));
  const at::Tensor g1 = grad_of(0, 0, 5), g2 = grad_of(1, 0, 5), g3 = grad_of(0, 1, 5);
  shard.step(pull(0, 0), kNever);
  shard.step(push(0, 1, g1), kNever);
  shard.step(push(0, 2, g3, 1), kNever);  // worker 0 runs ahead: nobody waits
  const auto r = shard.step(push(1, 1, g2, 0), kNever);
  const at::Tensor expect = x0 - 0.05 * (g1 + g2 + g3);
  EXPECT_TRUE(torch::allclose(as_tensor(r.values), expect, 1e-6, 1e-6));
  EXPECT_EQ(r.version, 3);
  const ShardStats st = shard.stats();
  EXPECT_EQ(st.pushes, 3);
  EXPECT_EQ(st.max_staleness_seen, 2);  // worker 1's gradient came from version 0, applied at 2
  EXPECT_NEAR(st.mean_staleness, (0 + 0 + 2) / 3.0, 1e-12);
  EXPECT_EQ(st.max_lead, 2);
}

// s = 0 is sync data parallelism through the server: every worker sees, at step k, the model
// that SGD with momentum reaches after k steps on the averaged gradients, and the learning
// rate schedule is indexed by the round.
TEST(Shard, SyncThroughTheServerEqualsSgdOnTheAverage) {
  const int W = 3, K = 6;
  const int64_t n = 11;
  const at::Tensor x0 = torch::cos(torch::arange(n, at::kFloat));
  ShardOptions o = options(W, 0);
  o.lr_at = [](int64_t t) { return 0.1 / (1.0 + t); };
  ShardState shard(o, x0, sgd(1.0, 0.9));

  // The reference: one parameter, torch SGD, averaged gradients.
  at::Tensor ref = x0.clone().set_requires_grad(true);
  torch::optim::SGD opt({ref}, torch::optim::SGDOptions(1.0).momentum(0.9));
  std::vector<at::Tensor> expected{x0.clone()};
  for (int k = 0; k < K; ++k) {
    at::Tensor avg = torch::zeros({n});
    for (int w = 0; w < W; ++w) avg += grad_of(w, k, n);
    for (auto& g : opt.param_groups()) g.options().set_lr(0.1 / (1.0 + k));
    ref.mutable_grad() = avg / W;
    opt.step();
    expected.push_back(ref.detach().clone());
  }

  std::vector<std::vector<at::Tensor>> seen(W);
  std::vector<std::thread> threads;
  for (int w = 0; w < W; ++w)
    threads.emplace_back([&, w] {
      seen[w].push_back(as_tensor(shard.step(pull(w, 0), kNever).values));
      for (int k = 0; k < K; ++k) {
        const at::Tensor g = grad_of(w, k, n);
        ShardState::Step s = push(w, k + 1, g);
        s.leave = k + 1 == K;
        const auto r = shard.step(s, kNever);
        if (!s.leave) seen[w].push_back(as_tensor(r.values));
      }
    });
  for (auto& t : threads) t.join();

  for (int w = 0; w < W; ++w) {
    ASSERT_EQ(seen[w].size(), static_cast<size_t>(K));
    for (int k = 0; k < K; ++k)
      EXPECT_TRUE(torch::allclose(seen[w][k], expected[k], 1e-6, 1e-6))
          << "worker " << w << " step " << k;
  }
  EXPECT_TRUE(shard.done());
  EXPECT_TRUE(torch::allclose(shard.values(), expected[K], 1e-6, 1e-6));
  EXPECT_EQ(shard.stats().version, K);
  EXPECT_EQ(shard.stats().dropped, 0);
}

// s > 0: a worker about to compute step c waits until everyone live has pushed c - s steps.
TEST(Shard, BoundedStalenessBlocksTheWorkerThatRunsAhead) {
  const at::Tensor x0 = torch::zeros({4});
  ShardState shard(options(2, 2), x0, sgd(0.1));
  const at::Tensor g = torch::ones({4});
  std::atomic<int> polled{0};
  const std::function<bool()> probe = [&] {
    ++polled;
    return true;  // "the caller went away" the first time the call would wait
  };
  shard.step(pull(1, 0), kNever);
  shard.step(pull(0, 0), probe);
  shard.step(push(0, 1, g), probe);
  shard.step(push(0, 2, g), probe);
  EXPECT_EQ(polled.load(), 0) << "two steps ahead is within max_staleness 2";
  EXPECT_THROW(shard.step(push(0, 3, g), probe), Error);
  EXPECT_EQ(polled.load(), 1) << "the third step must wait for worker 1";
  // Worker 1 catches up one step: worker 0 may now compute step 3.
  shard.step(push(1, 1, g), kNever);
  polled = 0;
  shard.step(pull(0, 3), probe);
  EXPECT_EQ(polled.load(), 0);
  EXPECT_EQ(shard.stats().max_lead, 2);
}

// A worker that stops calling is counted out after worker_timeout: the others go on without
// it (an s = 0 round completes with the gradients that came); when it calls again it is back,
// and its gradient for a round already applied is dropped.
TEST(Shard, SilentWorkerIsCountedOutAndBackIn) {
  const at::Tensor x0 = torch::zeros({3});
  ShardState shard(options(2, 0, 0.5, 200ms), x0, sgd(0.5));
  const at::Tensor g0 = torch::tensor({1.f, 2.f, 3.f}), g1 = torch::tensor({5.f, 5.f, 5.f});
  shard.step(pull(0, 0), kNever);
  shard.step(pull(1, 0), kNever);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = shard.step(push(0, 1, g0), kNever);  // waits until worker 1 is counted out
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms);
  EXPECT_EQ(r.version, 1);
  EXPECT_TRUE(torch::allclose(as_tensor(r.values), -0.5 * g0));
  ShardStats st = shard.stats();
  EXPECT_EQ(st.workers[1].status, WorkerState::Status::kDead);
  EXPECT_EQ(st.workers[1].times_counted_out, 1);
  EXPECT_FALSE(shard.done());  // worker 0 is still running

  // Worker 1 comes back with its step-0 gradient: too late, dropped; it is running again.
  shard.step(push(1, 1, g1), kNever);
  st = shard.stats();
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.workers[1].status, WorkerState::Status::kRunning);
  EXPECT_TRUE(torch::allclose(shard.values(), -0.5 * g0));

  // Both leave with step 1: that round has both gradients.
  ShardState::Step a = push(0, 2, g0), b = push(1, 2, g1);
  a.leave = b.leave = true;
  shard.step(a, kNever);
  EXPECT_FALSE(shard.done());
  shard.step(b, kNever);
  EXPECT_TRUE(shard.done());
  EXPECT_TRUE(shard.wait_done(0ms));
  EXPECT_TRUE(torch::allclose(shard.values(), -0.5 * g0 - 0.5 * (g0 + g1) / 2));
  EXPECT_EQ(shard.stats().workers[0].clock_when_first_finished, 2);
  EXPECT_EQ(shard.stats().workers[1].clock_when_first_finished, 1);
}

TEST(Shard, WaitDoneCountsOutWorkersThatNeverCame) {
  ShardState shard(options(2, -1, 0.1, 100ms), torch::zeros({2}), sgd(0.1));
  ShardState::Step s = pull(0, 0);
  s.leave = true;
  shard.step(s, kNever);
  EXPECT_FALSE(shard.done());
  EXPECT_TRUE(shard.wait_done(5000ms));
  EXPECT_EQ(shard.stats().workers[1].status, WorkerState::Status::kDead);
}

TEST(Shard, BadInputIsRefusedNamingTheProblem) {
  EXPECT_THROW(ShardState(options(0, -1), torch::zeros({2}), sgd(0.1)), InvalidArgument);
  ShardState shard(options(2, -1), torch::zeros({4}), sgd(0.1));
  const at::Tensor g = torch::ones({4}), short_g = torch::ones({3});
  try {
    shard.step(push(0, 1, short_g), kNever);
    ADD_FAILURE() << "a gradient of the wrong length was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pushed 3 gradient values"), std::string::npos)
        << e.what();
  }
  try {
    shard.step(push(0, 2, g), kNever);
    ADD_FAILURE() << "a skipped clock was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("clock 2 after clock 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(shard.step(pull(2, 0), kNever), InvalidArgument);
  EXPECT_THROW(shard.step(pull(-1, 0), kNever), InvalidArgument);
  EXPECT_THROW(shard.step(pull(0, 5), kNever), InvalidArgument);
  ShardState::Step s = push(0, 1, g);
  s.leave = true;
  shard.step(s, kNever);
  EXPECT_THROW(shard.step(push(0, 2, g), kNever), InvalidArgument);
  EXPECT_EQ(shard.stats().pushes, 1);  // nothing refused was applied
  EXPECT_TRUE(torch::allclose(shard.values(), -0.05 * g));
}

// The base version comes off the wire (StepRequest.base_version): INT64_MIN made the staleness
// `version - base` overflow (UBSan, with the request fuzz_ps_payload's seed base-version-min
// carries); a version the shard never had is refused by name.
TEST(Shard, ABaseVersionTheShardNeverHadIsRefused) {
  ShardState shard(options(1, -1), torch::zeros({4}), sgd(0.1));
  const at::Tensor g = torch::ones({4});
  for (int64_t base : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{1}}) {
    try {
      shard.step(push(0, 1, g, base), kNever);
      ADD_FAILURE() << "base version " << base << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("gradient of version"), std::string::npos) << e.what();
    }
  }
  shard.step(push(0, 1, g, 0), kNever);
  EXPECT_EQ(shard.stats().pushes, 1);
}

// Many threads: the staleness bound holds whatever the interleaving, and every push counts.
TEST(Shard, ConcurrentWorkersNeverLeadMoreThanMaxStaleness) {
  const int W = 4, K = 40;
  ShardState shard(options(W, 2), torch::zeros({64}), sgd(0.01));
  std::vector<std::thread> threads;
  for (int w = 0; w < W; ++w)
    threads.emplace_back([&, w] {
      shard.step(pull(w, 0), kNever);
      for (int k = 0; k < K; ++k) {
        if (w == 0) std::this_thread::sleep_for(1ms);  // the slow one
        const at::Tensor g = grad_of(w, k, 64);
        ShardState::Step s = push(w, k + 1, g);
        s.leave = k + 1 == K;
        shard.step(s, kNever);
      }
    });
  for (auto& t : threads) t.join();
  const ShardStats st = shard.stats();
  EXPECT_LE(st.max_lead, 2);
  EXPECT_EQ(st.pushes, W * K);
  EXPECT_EQ(st.version, W * K);
  EXPECT_TRUE(shard.done());
}

// Without a bound, fast workers do not wait for a slow one at all: they finish while it is
// still at step 0.
TEST(Shard, UnboundedFastWorkersFinishWhileTheSlowOneIsAtStepZero) {
  const int W = 3, K = 20;
  ShardState shard(options(W, -1), torch::zeros({8}), sgd(0.01));
  std::atomic<int> fast_done{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < W; ++w)
    threads.emplace_back([&, w] {
      shard.step(pull(w, 0), kNever);
      if (w == 0)
        while (fast_done.load() < W - 1) std::this_thread::sleep_for(1ms);
      for (int k = 0; k < K; ++k) {
        const at::Tensor g = grad_of(w, k, 8);
        ShardState::Step s = push(w, k + 1, g);
        s.leave = k + 1 == K;
        shard.step(s, kNever);
      }
      if (w != 0) ++fast_done;
    });
  for (auto& t : threads) t.join();
  const ShardStats st = shard.stats();
  EXPECT_EQ(st.max_lead, K - 1);  // the last pull before leaving was for step K - 1
  EXPECT_EQ(st.workers[0].clock_when_first_finished, 0);
  EXPECT_EQ(st.pushes, W * K);
}

// The job is total_pushes gradients: tickets hand out the data in order to whoever asks, and
// once the last gradient is in every reply says stop (without parameters) — also to a worker
// that was waiting for a slower one.
TEST(Shard, WorkBudgetStopsEveryoneAndTicketsAreHandedOutInOrder) {
  ShardOptions o = options(2, 1);
  o.total_pushes = 5;
  o.issue_tickets = true;
  ShardState shard(o, torch::zeros({2}), sgd(0.1));
  const at::Tensor g = torch::ones({2});
  EXPECT_EQ(shard.step(pull(0, 0), kNever).ticket, 0);
  EXPECT_EQ(shard.step(pull(1, 0), kNever).ticket, 1);
  EXPECT_EQ(shard.step(push(0, 1, g), kNever).ticket, 2);
  EXPECT_EQ(shard.step(push(1, 1, g), kNever).ticket, 3);
  EXPECT_EQ(shard.step(push(0, 2, g), kNever).ticket, 4);
  // Worker 0 is one step ahead of worker 1 (max_staleness 1): its next pull would wait...
  std::atomic<bool> waiting{false};
  ShardState::Reply r0;
  std::thread t([&] {
    r0 = shard.step(push(0, 3, g), [&] {
      waiting = true;
      return false;
    });
  });
  while (!waiting) std::this_thread::sleep_for(1ms);
  // ... until worker 1's push completes the job: both are told to stop.
  const auto r1 = shard.step(push(1, 2, g), kNever);
  t.join();
  EXPECT_TRUE(r1.stop);
  EXPECT_TRUE(r0.stop);
  EXPECT_TRUE(r0.values.empty());
  EXPECT_EQ(r0.ticket, -1);
  EXPECT_EQ(shard.stats().pushes, 5);
  // They leave without pushing.
  ShardState::Step a = pull(0, 3), b = pull(1, 2);
  a.leave = b.leave = true;
  shard.step(a, kNever);
  shard.step(b, kNever);
  EXPECT_TRUE(shard.done());
  EXPECT_TRUE(torch::allclose(shard.values(), -0.05 * 5 * g));
}

// s = 0 when the job's last gradient arrives mid-round (a worker is behind or gone): the round
// is applied with what came instead of being lost, and nobody waits for the missing worker.
TEST(Shard, SyncRoundCutShortByTheBudgetIsStillApplied) {
  ShardOptions o = options(2, 0, 1.0);
  o.total_pushes = 3;
  ShardState shard(o, torch::zeros({2}), sgd(1.0));
  const at::Tensor g = torch::tensor({1.f, -1.f}), g3 = 3 * g;
  shard.step(pull(0, 0), kNever);
  shard.step(pull(1, 0), kNever);
  std::thread t([&] { shard.step(push(1, 1, g3), kNever); });  // then worker 1 goes silent
  const auto r = shard.step(push(0, 1, g), kNever);            // round 0: both
  t.join();
  EXPECT_FALSE(r.stop);
  EXPECT_TRUE(torch::allclose(shard.values(), -2 * g));
  const auto last = shard.step(push(0, 2, g), kNever);  // 3rd push: the budget, mid-round
  EXPECT_TRUE(last.stop);
  EXPECT_EQ(shard.stats().version, 2);
  EXPECT_TRUE(torch::allclose(shard.values(), -3 * g));
}

// K = W (the default the CLI uses): every W gradients, whoever sent them, make one optimizer
// step on their average — torch's SGD with momentum on those averages, the learning-rate
// schedule indexed by the step — even when one worker sends more than its share.
TEST(Shard, AggregatedGroupsAreSgdStepsOnTheirAverage) {
  const int64_t n = 7;
  const at::Tensor x0 = torch::sin(torch::arange(n, at::kFloat));
  ShardOptions o = options(2, -1);
  o.aggregate = 2;
  o.lr_at = [](int64_t t) { return 0.1 / (1.0 + t); };
  ShardState shard(o, x0, sgd(1.0, 0.9));
  // Arrival order: w0, w0, w1, w0, w1, w1 -> groups {w0 k0, w0 k1}, {w1 k0, w0 k2}, {w1 k1, w1 k2}.
  const std::vector<std::pair<int, int>> order{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {1, 2}};
  at::Tensor ref = x0.clone().set_requires_grad(true);
  torch::optim::SGD opt({ref}, torch::optim::SGDOptions(1.0).momentum(0.9));
  for (size_t i = 0; i < order.size(); i += 2) {
    const auto [wa, ka] = order[i];
    const auto [wb, kb] = order[i + 1];
    for (auto& g : opt.param_groups()) g.options().set_lr(0.1 / (1.0 + i / 2));
    ref.mutable_grad() = (grad_of(wa, ka, n) + grad_of(wb, kb, n)) / 2;
    opt.step();
  }
  shard.step(pull(0, 0), kNever);
  shard.step(pull(1, 0), kNever);
  int64_t versions_seen = 0;
  for (const auto& [w, k] : order) {
    const at::Tensor g = grad_of(w, k, n);
    versions_seen = shard.step(push(w, k + 1, g), kNever).version;
  }
  EXPECT_EQ(versions_seen, 3);
  EXPECT_TRUE(torch::allclose(shard.values(), ref.detach(), 1e-6, 1e-6));
  EXPECT_EQ(shard.stats().pushes, 6);
}

// staleness_damping: a gradient `staleness` updates old counts 1 / (1 + staleness).
TEST(Shard, StalenessDampingScalesStaleGradients) {
  const at::Tensor x0 = torch::linspace(-1, 1, 5);
  ShardOptions o = options(2, -1, 0.1);
  o.staleness_damping = true;
  ShardState shard(o, x0, sgd(0.1));
  const at::Tensor g1 = grad_of(0, 0, 5), g2 = grad_of(1, 0, 5), g3 = grad_of(0, 1, 5);
  shard.step(push(0, 1, g1, 0), kNever);  // staleness 0
  shard.step(push(0, 2, g3, 1), kNever);  // 0
  shard.step(push(1, 1, g2, 0), kNever);  // 2: counts a third
  EXPECT_TRUE(torch::allclose(shard.values(), x0 - 0.05 * (g1 + g3 + g2 / 3), 1e-6, 1e-6));
}

// extrapolate: a pull is answered with w + tau * (last update), tau the server updates expected
// before the puller's gradient arrives; the shard's own values stay the optimizer's.
TEST(Shard, ExtrapolatedPullsLeadByThePredictedUpdates) {
  const int64_t n = 6;
  const at::Tensor x0 = torch::cos(torch::arange(n, at::kFloat));
  ShardOptions o = options(2, -1, 0.1);
  o.aggregate = 2;
  o.extrapolate = true;
  ShardState shard(o, x0, sgd(0.1, 0.9));
  at::Tensor ref = x0.clone().set_requires_grad(true);
  torch::optim::SGD opt({ref}, torch::optim::SGDOptions(0.1).momentum(0.9));
  auto ref_step = [&](const at::Tensor& g) {
    ref.mutable_grad() = g;
    opt.step();
  };
  // Nothing applied yet: there is no update to extrapolate along.
  EXPECT_TRUE(torch::equal(as_tensor(shard.step(pull(0, 0), kNever).values), x0));
  shard.step(pull(1, 0), kNever);
  const at::Tensor a = grad_of(0, 0, n), b = grad_of(1, 0, n), c = grad_of(0, 1, n);
  // Worker 0's push opens a group (1 of 2): the other worker's push will close it before
  // worker 0's next one arrives, so tau = (1 + 1) / 2 = 1 -- but no update exists yet.
  EXPECT_TRUE(torch::equal(as_tensor(shard.step(push(0, 1, a), kNever).values), x0));
  // Worker 1 closes the group: tau = (0 + 1) / 2 = 0, the reply is the optimizer's point.
  const at::Tensor before = ref.detach().clone();
  ref_step((a + b) / 2);
  const at::Tensor delta1 = ref.detach() - before;
  EXPECT_TRUE(torch::allclose(as_tensor(shard.step(push(1, 1, b), kNever).values), ref.detach(),
                              1e-6, 1e-6));
  // Worker 0 opens the next group: tau = 1, the reply is one last-update ahead.
  const auto r = shard.step(push(0, 2, c, 1), kNever);
  EXPECT_TRUE(torch::allclose(as_tensor(r.values), ref.detach() + delta1, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(shard.values(), ref.detach(), 1e-6, 1e-6));
  EXPECT_EQ(r.version, 1);
}

// One gradient per update (K = 1) and three workers: the two others push before the puller,
// tau = 2 updates.
TEST(Shard, ExtrapolationWithPerPushUpdatesLeadsByTheOtherWorkers) {
  const int64_t n = 5;
  const at::Tensor x0 = torch::linspace(-1, 1, n);
  ShardOptions o = options(3, -1, 0.3);
  o.extrapolate = true;  // aggregate stays 1
  ShardState shard(o, x0, sgd(0.1, 0.5));
  const at::Tensor g = grad_of(2, 0, n);
  shard.step(pull(0, 0), kNever);
  shard.step(pull(1, 0), kNever);
  const at::Tensor before = shard.values();
  const auto r = shard.step(push(2, 1, g), kNever);
  const at::Tensor delta = -(0.3 / 3) * g;  // lr / workers, the momentum buffer starts at g
  EXPECT_TRUE(torch::allclose(shard.values(), before + delta, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(as_tensor(r.values), before + 3 * delta, 1e-6, 1e-6));
}

// Sync through the server (s = 0) has no staleness to compensate: the option changes nothing.
TEST(Shard, ExtrapolationLeavesSyncThroughTheServerAlone) {
  const int64_t n = 4, rounds = 3;
  const at::Tensor x0 = torch::linspace(0, 1, n);
  auto run = [&](bool extrapolate) {
    ShardOptions o = options(2, 0, 0.1);
    o.extrapolate = extrapolate;
    ShardState shard(o, x0, sgd(0.1, 0.9));
    std::vector<at::Tensor> last(2);
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w)
      workers.emplace_back([&, w] {
        for (int64_t k = 0; k < rounds; ++k) {
          const at::Tensor g = grad_of(w, k, n);
          last[w] = as_tensor(shard.step(push(w, k + 1, g, k), kNever).values);
        }
      });
    for (auto& t : workers) t.join();
    EXPECT_TRUE(torch::equal(last[0], last[1]));
    EXPECT_TRUE(torch::equal(last[0], shard.values()));
    return last[0];
  };
  EXPECT_TRUE(torch::equal(run(true), run(false)));
}

// What the option is for: on a quadratic, with heavy momentum and four workers taking turns
// (each gradient one update stale when it lands, as on the real job), extrapolated pulls keep
// the iterates closer to sync's than plain stale pulls do.
TEST(Shard, ExtrapolationTracksSyncOnAQuadraticWithStaleGradients) {
  const int64_t n = 16, W = 4, rounds = 60;
  const at::Tensor target = torch::sin(torch::arange(n, at::kFloat) * 0.7);
  const at::Tensor curv = torch::linspace(0.5, 2.0, n);
  auto grad_at = [&](const at::Tensor& w) { return curv * (w - target); };
  const at::Tensor x0 = torch::zeros({n});
  // Sync: every update averages W gradients taken at the current point.
  at::Tensor ref = x0.clone().set_requires_grad(true);
  torch::optim::SGD opt({ref}, torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t k = 0; k < rounds; ++k) {
    ref.mutable_grad() = grad_at(ref.detach());
    opt.step();
  }
  auto run = [&](bool extrapolate) {
    ShardOptions o = options(W, -1, 0.1);
    o.aggregate = W;
    o.extrapolate = extrapolate;
    ShardState shard(o, x0, sgd(0.1, 0.9));
    // Worker w's pull is answered after w pushes of the group: staggered like real workers.
    std::vector<at::Tensor> pulled(W);
    std::vector<int64_t> base(W, 0);
    for (int w = 0; w < W; ++w) pulled[w] = as_tensor(shard.step(pull(w, 0), kNever).values);
    for (int64_t k = 0; k < rounds; ++k)
      for (int w = 0; w < W; ++w) {
        const at::Tensor g = grad_at(pulled[w]).contiguous();
        const auto r = shard.step(push(w, k + 1, g, base[w]), kNever);
        pulled[w] = as_tensor(r.values);
        base[w] = r.version;
      }
    const ShardStats st = shard.stats();
    EXPECT_GT(st.mean_staleness, 0.5);
    // Workers taking turns are the pattern the prediction assumes: every push as predicted.
    if (extrapolate) {
      EXPECT_EQ(st.predicted_exactly, rounds * W);
      EXPECT_EQ(st.mean_prediction_error, 0.0);
    }
    return (shard.values() - ref.detach()).norm().item<double>();
  };
  const double plain = run(false), ahead = run(true);
  EXPECT_LT(ahead, 0.5 * plain) << "plain " << plain << ", extrapolated " << ahead;
}

// Unequal workers: three push every tick, the fourth every third tick, so 9 pushes land
// between its pull and its push. The prediction follows what each worker saw during its last
// steps, so after the first steps every push lands with the staleness its pull was given.
TEST(Shard, ExtrapolationPredictsTheSlowWorkersLargerStaleness) {
  const int64_t n = 8, W = 4, ticks = 30;
  const at::Tensor x0 = torch::zeros({n});
  ShardOptions o = options(W, -1, 0.1);
  o.aggregate = W;
  o.extrapolate = true;
  ShardState shard(o, x0, sgd(0.1, 0.9));
  std::vector<int64_t> clock(W, 0), base(W, 0);
  for (int w = 0; w < W; ++w) shard.step(pull(w, 0), kNever);
  int64_t slow_pushes = 0;
  for (int64_t t = 0; t < ticks; ++t)
    for (int w = 0; w < W; ++w) {
      if (w == W - 1 && t % 3 != 2) continue;
      slow_pushes += w == W - 1 ? 1 : 0;
      const at::Tensor g = grad_of(w, clock[w], n);
      base[w] = shard.step(push(w, ++clock[w], g, base[w]), kNever).version;
    }
  const ShardStats st = shard.stats();
  EXPECT_EQ(st.pushes, 3 * ticks + slow_pushes);
  EXPECT_GE(st.max_staleness_seen, 2);  // the slow worker's gradients are 2-3 updates old
  // The slow worker's every push after its first two was predicted exactly (its first was
  // predicted as if it were as fast as the others). A fast worker sees 2 or 3 pushes per step
  // (3 when the slow one pushed meanwhile), which an average of the past cannot foretell, so
  // it is off by one at times.
  const WorkerState& slow = st.workers[W - 1];
  EXPECT_EQ(slow.predictions, slow_pushes);
  EXPECT_GE(slow.predicted_exactly, slow_pushes - 2);
  EXPECT_LT(st.mean_prediction_error, 0.5);
}

}  // namespace
}  // namespace krab::sync
