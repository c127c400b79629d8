// DataParallel on ranks that are threads of one process (loopback Gloo). The independent
// expectation is always a plain single-process computation: the average of the gradients every
// rank's data gives on an identical copy of the model.
#include "parallel/data_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "comm/factory.h"
#include "models/model.h"
#include "support/gloo_ranks.h"

namespace krab::parallel {
namespace {

using namespace std::chrono_literals;

// A hook that counts calls and records whether backward had finished when each came.
class CountingHook : public CommHook {
 public:
  explicit CountingHook(std::atomic<bool>* backward_done) : backward_done_(backward_done) {}
  std::string name() const override { return "counting"; }
  comm::WorkPtr reduce(comm::Communicator& comm, at::Tensor& bucket, int64_t index,
                       int64_t step) override {
    ++calls;
    if (!backward_done_->load()) ++during_backward;
    indices.push_back(index);
    return comm.allreduce(bucket, comm::ReduceOp::kAvg);
  }
  int calls = 0;
  int during_backward = 0;
  std::vector<int64_t> indices;

 private:
  std::atomic<bool>* backward_done_;
};

// Ranks are threads, and initial weights come from torch's one global generator: seeding and
// drawing must happen under one lock, or two ranks' models interleave their draws.
std::mutex g_init_mu;

std::shared_ptr<models::Model> make_mlp(int64_t in, int64_t hidden, int64_t classes,
                                        uint64_t seed = 7) {
  std::lock_guard<std::mutex> lock(g_init_mu);
  torch::manual_seed(seed);
  models::ModelSpec s;
  s.name = "mlp";
  s.input_shape = {in};
  s.hidden = hidden;
  s.num_classes = classes;
  return models::make_model(s);
}

// Rank r's batch: deterministic in r.
std::pair<at::Tensor, at::Tensor> batch_of(int r, int64_t n, int64_t in, int64_t classes) {
  auto g = at::detail::createCPUGenerator(1000 + r);
  auto x = at::randn({n, in}, g);
  auto y = at::randint(0, classes, {n}, g, at::kLong);
  return {x, y};
}

template <typename Fn>
void run_ranks(int size, Fn fn) {
  testing::run_gloo_ranks(size, fn);
}

// The expectation: average over ranks of each rank's gradient on the rank-0 initial weights.
std::vector<at::Tensor> reference_grads(int W, int64_t n, int64_t in, int64_t hidden,
                                        int64_t classes) {
  auto ref = make_mlp(in, hidden, classes);
  std::vector<at::Tensor> sum;
  for (int r = 0; r < W; ++r) {
    ref->zero_grad();
    auto [x, y] = batch_of(r, n, in, classes);
    ref->loss(ref->forward(x), y).backward();
    auto ps = ref->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      if (sum.size() <= i) sum.push_back(torch::zeros_like(ps[i]));
      sum[i] += ps[i].grad();
    }
  }
  for (auto& s : sum) s /= W;
  return sum;
}

class DataParallelTest : public ::testing::TestWithParam<double> {};

TEST_P(DataParallelTest, GradientsAreTheAverageOfEveryRanksGradient) {
  const int W = 3;
  const int64_t in = 12, hidden = 16, classes = 5, n = 8;
  const auto expect = reference_grads(W, n, in, hidden, classes);
  run_ranks(W, [&](int r, comm::Communicator& c) {
    // Every rank starts from different weights; the broadcast must make them rank 0's.
    auto model = make_mlp(in, hidden, classes, 7 + r);
    if (r == 0) {
      auto ref = make_mlp(in, hidden, classes);
      torch::NoGradGuard g;
      auto a = model->parameters(), b = ref->parameters();
      for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
    }
    DataParallel dp(*model, c, {GetParam()});
    auto [x, y] = batch_of(r, n, in, classes);
    model->loss(model->forward(x), y).backward();
    dp.finish();
    auto ps = model->parameters();
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_TRUE(torch::allclose(ps[i].grad(), expect[i], 1e-5, 1e-6))
          << "rank " << r << " param " << i;
  });
}

// bucket_mb 0: a bucket per tensor; 1e-4 MiB (~100 bytes): several small buckets; 25: one.
INSTANTIATE_TEST_SUITE_P(BucketSizes, DataParallelTest, ::testing::Values(0.0, 1e-4, 25.0));

TEST(DataParallel, BucketsLaunchDuringBackwardInBucketOrder) {
  run_ranks(2, [](int r, comm::Communicator& c) {
    auto model = make_mlp(12, 16, 5);
    std::atomic<bool> done{false};
    auto hook = std::make_unique<CountingHook>(&done);
    CountingHook* h = hook.get();
    DataParallel dp(*model, c, {0.0}, std::move(hook));
    ASSERT_EQ(dp.plan().buckets.size(), 6u);  // 3 linear layers x (weight, bias)
    auto [x, y] = batch_of(r, 8, 12, 5);
    model->loss(model->forward(x), y).backward();
    done = true;
    // Every bucket was handed to the hook from the gradient-ready hooks, before finish().
    EXPECT_EQ(h->during_backward, 6);
    dp.finish();
    EXPECT_EQ(h->calls, 6);
    EXPECT_EQ(h->indices, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  });
}

TEST(DataParallel, AccumulationCommunicatesOnlyOnTheLastMicroStep) {
  const int W = 2;
  const int64_t in = 6, hidden = 8, classes = 3, n = 4;
  run_ranks(W, [&](int r, comm::Communicator& c) {
    auto model = make_mlp(in, hidden, classes);
    DataParallel dp(*model, c, {25.0});
    const auto before = c.traffic().total_bytes_sent();
    dp.set_sync(false);
    auto [x1, y1] = batch_of(10 * r, n, in, classes);
    model->loss(model->forward(x1), y1).backward();
    dp.finish();  // no-op
    EXPECT_EQ(c.traffic().total_bytes_sent(), before) << "a non-final micro-step communicated";
    dp.set_sync(true);
    auto [x2, y2] = batch_of(10 * r + 1, n, in, classes);
    model->loss(model->forward(x2), y2).backward();
    dp.finish();
    EXPECT_GT(c.traffic().total_bytes_sent(), before);

    // Expectation: the sum of both micro-batches' gradients, averaged over ranks.
    auto ref = make_mlp(in, hidden, classes);
    for (int q = 0; q < W; ++q)
      for (int m = 0; m < 2; ++m) {
        auto [x, y] = batch_of(10 * q + m, n, in, classes);
        (ref->loss(ref->forward(x), y) / W).backward();
      }
    auto a = model->parameters(), b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad(), 1e-5, 1e-6)) << i;
  });
}

// An engine destroyed and another built on the same module mid-training (what an elastic
// rebuild does): the old engine's hooks, which LibTorch keeps, must neither touch freed memory
// (ASan would see it) nor reduce anything; the new engine alone averages the gradients.
TEST(DataParallel, AnEngineCanBeRebuiltOnTheSameModuleMidTraining) {
  const int W = 2;
  const int64_t in = 6, hidden = 8, classes = 3, n = 4;
  run_ranks(W, [&](int r, comm::Communicator& c) {
    auto model = make_mlp(in, hidden, classes);
    auto first = std::make_unique<DataParallel>(*model, c, DataParallelOptions{0.0});
    auto [x1, y1] = batch_of(r, n, in, classes);
    model->loss(model->forward(x1), y1).backward();
    first->finish();
    // A graph built while the engine lived holds its gradient accumulators, hooks included;
    // the engine goes (the group changed mid-step), then that backward runs: the dead hooks
    // fire and must do nothing.
    model->zero_grad();
    at::Tensor pending = model->loss(model->forward(x1), y1);
    first.reset();
    pending.backward();
    std::atomic<bool> done{false};
    auto hook = std::make_unique<CountingHook>(&done);
    CountingHook* h = hook.get();
    DataParallel second(*model, c, {0.0}, std::move(hook));
    model->zero_grad();
    auto [x2, y2] = batch_of(20 + r, n, in, classes);
    model->loss(model->forward(x2), y2).backward();
    done = true;
    second.finish();
    EXPECT_EQ(h->calls, static_cast<int>(second.plan().buckets.size()));
    // Expectation: the average over ranks of the second batch's gradient, on the same weights.
    auto ref = make_mlp(in, hidden, classes);
    for (int q = 0; q < W; ++q) {
      auto [x, y] = batch_of(20 + q, n, in, classes);
      (ref->loss(ref->forward(x), y) / W).backward();
    }
    auto a = model->parameters(), b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad(), 1e-5, 1e-6)) << i;
  });
}

// A parameter outside the graph gets no gradient on any rank; the engine must still complete
// the step (zeros), not wait for a hook that never fires.
TEST(DataParallel, UnusedParameterContributesZeros) {
  struct TwoHeads : torch::nn::Module {
    TwoHeads() {
      a = register_module("a", torch::nn::Linear(4, 2));
      b = register_module("b", torch::nn::Linear(4, 2));
    }
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  run_ranks(2, [](int r, comm::Communicator& c) {
    std::unique_lock<std::mutex> lock(g_init_mu);
    torch::manual_seed(3);
    TwoHeads m;
    lock.unlock();
    DataParallel dp(m, c, {0.0});
    auto x = torch::ones({3, 4}) * (r + 1);
    m.a->forward(x).sum().backward();
    dp.finish();
    EXPECT_TRUE(m.b->weight.grad().defined());
    EXPECT_EQ(m.b->weight.grad().abs().sum().item<float>(), 0.0f);
    // a's weight gradient: rows are sum over the batch of x = 3 * (r + 1); average over
    // ranks = 3 * 1.5 = 4.5.
    EXPECT_TRUE(torch::allclose(m.a->weight.grad(), torch::full({2, 4}, 4.5f)));
  });
}

}  // namespace
}  // namespace krab::parallel
