// parallel/auto_compression.h: the policy against decisions worked out by hand, the candidates'
// bytes against the formulas of their compressors, and the hook on thread ranks: every rank
// switches at the same step and the replicas stay bit-identical through the switches.
#include "parallel/auto_compression.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "parallel/data_parallel.h"
#include "support/gloo_ranks.h"

namespace krab::parallel {
namespace {

std::vector<AutoCandidate> four(double fp16 = 0.5, double powersgd = 0.05, double topk = 0.02) {
  return {{"none", 1}, {"fp16", fp16}, {"powersgd", powersgd}, {"topk", topk}};
}

TEST(AutoPolicy, AShareWithinTargetKeepsTheCompressor) {
  AutoPolicy p(four());
  EXPECT_EQ(p.decide(0, 0.05), 0u);
  EXPECT_EQ(p.decide(0, 0.10), 0u);
}

TEST(AutoPolicy, TheLeastLossyCandidatePredictedWithinTargetIsTaken) {
  // 0.15 of the step with fp32: fp16 halves it to 0.075, within 0.10.
  AutoPolicy p(four());
  EXPECT_EQ(p.decide(0, 0.15), 1u);
  // 0.6 with fp32: fp16 would leave 0.3; powersgd 0.03.
  AutoPolicy q(four());
  EXPECT_EQ(q.decide(0, 0.6), 2u);
  // From fp16 at 0.2 (0.4 per fp32 byte): powersgd's 0.05 bytes give 0.02.
  AutoPolicy r(four());
  EXPECT_EQ(r.decide(1, 0.2), 2u);
}

TEST(AutoPolicy, NothingWithinTargetTakesTheFewestBytesButTopkOnlyAfterPowersgd) {
  // 20 s of exposed communication per second: nothing is predicted within target; topk is not
  // taken before powersgd was measured.
  AutoPolicy p(four());
  EXPECT_EQ(p.decide(0, 20.0), 2u);
  // powersgd measured slow in turn: topk.
  EXPECT_EQ(p.decide(2, 0.5), 3u);
  EXPECT_TRUE(p.candidates()[0].measured_slow);
  EXPECT_TRUE(p.candidates()[2].measured_slow);
}

TEST(AutoPolicy, ACandidateFoundSlowIsNotTakenAgain) {
  AutoPolicy p(four());
  EXPECT_EQ(p.decide(0, 0.15), 1u);  // none slow: fp16
  // fp16 measured fine: it stays, even though none would be predicted within target from here.
  EXPECT_EQ(p.decide(1, 0.01), 1u);
  // fp16 now slow (the link got worse): none is out, powersgd next.
  EXPECT_EQ(p.decide(1, 0.3), 2u);
}

TEST(AutoCandidates, BytesFollowEachCompressorsFormula) {
  compress::CompressionOptions o;
  o.rank = 4;
  o.ratio = 0.01;
  o.min_numel = 1024;
  // A 64 x 100 matrix (6400 values) and a bias of 64 (below min_numel: always fp32).
  const std::vector<BucketLayout> buckets = {{{0, {64, 100}}, {6400, {64}}}};
  const auto c = auto_candidates(buckets, o);
  ASSERT_EQ(c.size(), 4u);
  const double total = 4.0 * 6464;
  EXPECT_EQ(c[0].name, "none");
  EXPECT_DOUBLE_EQ(c[0].bytes, 1.0);
  EXPECT_DOUBLE_EQ(c[1].bytes, (2.0 * 6400 + 4.0 * 64) / total);
  EXPECT_DOUBLE_EQ(c[2].bytes, (4.0 * 4 * (64 + 100) + 4.0 * 64) / total);
  EXPECT_DOUBLE_EQ(c[3].bytes, (8.0 * 0.01 * 6400 + 4.0 * 64) / total);
}

std::mutex g_init_mu;

TEST(AutoCompressionHook, EveryRankSwitchesAtTheSameStepAndTheReplicasStayEqual) {
  // Target -1: every check finds the share too high, so the hook goes none -> powersgd (the
  // fewest bytes before topk is allowed) at step 6, then -> topk at step 12.
  constexpr int W = 2, kSteps = 16;
  std::vector<nlohmann::json> decisions(W);
  std::vector<std::vector<at::Tensor>> finals(W);
  std::vector<std::string> names(W);
  testing::run_gloo_ranks(W, [&](int r, comm::Communicator& c) {
    std::shared_ptr<torch::nn::Sequential> net;
    {
      std::lock_guard<std::mutex> lock(g_init_mu);
      torch::manual_seed(3);
      net = std::make_shared<torch::nn::Sequential>(torch::nn::Linear(40, 64), torch::nn::ReLU(),
                                                    torch::nn::Linear(64, 5));
    }
    compress::CompressionOptions o;
    o.automatic = true;
    o.min_numel = 256;
    auto hook = std::make_unique<AutoCompressionHook>(o, AutoOptions{6, 6, 3, -1.0});
    AutoCompressionHook* h = hook.get();
    DataParallel dp(**net, c, {25.0}, std::move(hook));
    torch::optim::SGD opt((*net)->parameters(), 0.05);
    auto g = at::detail::createCPUGenerator(100 + r);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      auto x = at::randn({8, 40}, g);
      auto y = at::randint(0, 5, {8}, g, at::kLong);
      torch::nn::functional::cross_entropy((*net)->forward(x), y).backward();
      dp.finish();
      opt.step();
    }
    decisions[r] = h->decisions();
    names[r] = h->name();
    for (auto& p : (*net)->parameters()) finals[r].push_back(p.detach().clone());
  });
  EXPECT_EQ(decisions[0], decisions[1]);
  ASSERT_EQ(decisions[0].size(), 2u) << decisions[0];
  EXPECT_EQ(decisions[0][0]["step"], 6);
  EXPECT_EQ(decisions[0][0]["choice"], "powersgd");
  EXPECT_EQ(decisions[0][1]["step"], 12);
  EXPECT_EQ(decisions[0][1]["choice"], "topk");
  EXPECT_EQ(names[0], "auto: topk");
  ASSERT_EQ(finals[0].size(), finals[1].size());
  for (size_t i = 0; i < finals[0].size(); ++i)
    EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i]));
}

}  // namespace
}  // namespace krab::parallel
