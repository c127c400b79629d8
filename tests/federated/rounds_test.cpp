// The round loop against hand-computed aggregates: scripted participants whose updates are
// known, so every expectation is arithmetic done here, not by the code under test. Covers
// dropouts, rejections, failed rounds, robust aggregation, central DP, secure aggregation
// (with dropouts at every stage) and the server checkpoint.
#include "federated/rounds.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/errors.h"
#include "core/fs.h"
#include "federated/accountant.h"
#include "federated/client_policy.h"
#include "federated/secure_client.h"
#include "federated/server_state.h"
#include "scripted_participant.h"

namespace krab::federated {
namespace {

TEST(Rounds, FedAvgIsTheExampleWeightedMean) {
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::tensor({1.f, 0.f, -2.f}), 10));
  c.push_back(std::make_unique<Scripted>("b", torch::tensor({4.f, 3.f, 1.f}), 30));
  RoundRunner run(all_clients(), torch::tensor({0.5f, 0.5f, 0.5f}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok) << rec.failure;
  // 0.5 + (10 u_a + 30 u_b) / 40
  EXPECT_TRUE(
      torch::allclose(run.global(), torch::tensor({0.5f + 3.25f, 0.5f + 2.25f, 0.5f + 0.25f})));
  EXPECT_EQ(rec.counted, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(rec.bytes_down, 2 * 3 * 4);  // the global model to each
  EXPECT_GE(rec.bytes_up, 2 * 3 * 4);
  EXPECT_TRUE(torch::equal(c[0]->seen_global_, torch::tensor({0.5f, 0.5f, 0.5f})));
}

// train.metric loss: the evaluator's value lands in the record's test_loss (not its accuracy),
// survives the server checkpoint's JSON, and the report names the metric.
TEST(Rounds, ALossMetricIsRecordedAsTestLoss) {
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::tensor({1.f, 0.f}), 10));
  int calls = 0;
  RoundRunner run(all_clients(), torch::zeros({2}), false, [&calls](const at::Tensor&) {
    return RoundRunner::Score{true, 0.25 * ++calls};
  });
  run.run_round(ptrs(c));
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.test_loss.has_value());
  EXPECT_DOUBLE_EQ(*rec.test_loss, 0.5);
  EXPECT_LT(rec.test_accuracy, 0);
  const RoundRecord back = record_from_json(rec.to_json());
  ASSERT_TRUE(back.test_loss.has_value());
  EXPECT_DOUBLE_EQ(*back.test_loss, 0.5);
  EXPECT_FALSE(rec.to_json().contains("test_accuracy"));
  nlohmann::json report;
  add_history(report, run);
  EXPECT_EQ(report["metric"], "loss");
  EXPECT_DOUBLE_EQ(report["test_loss"].get<double>(), 0.5);
  EXPECT_FALSE(report.contains("test_accuracy"));
}

TEST(Rounds, DroppedAndRejectedClientsAreLeftOutAndNamed) {
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::tensor({1.f, 1.f}), 1));
  c.push_back(std::make_unique<Scripted>("b", torch::tensor({3.f, 5.f}), 1));
  c.push_back(std::make_unique<Scripted>("c", torch::tensor({9.f, 9.f}), 1, /*fail_at=*/0));
  c.push_back(std::make_unique<Scripted>("d", torch::tensor({NAN, 1.f}), 1));
  c.push_back(std::make_unique<Scripted>("e", torch::tensor({1.f, 2.f, 3.f}), 1));
  c.push_back(std::make_unique<Scripted>("f", torch::tensor({300.f, 400.f}), 1));
  FederatedOptions o = all_clients(2);
  o.max_update_norm = 100;
  RoundRunner run(o, torch::zeros({2}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok);
  EXPECT_TRUE(torch::allclose(run.global(), torch::tensor({2.f, 3.f})));
  EXPECT_EQ(rec.counted, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(rec.dropped.size(), 1u);
  EXPECT_EQ(rec.dropped[0].client, "c");
  EXPECT_NE(rec.dropped[0].reason.find("went away"), std::string::npos);
  ASSERT_EQ(rec.rejected.size(), 3u);
  EXPECT_NE(rec.rejected[0].reason.find("'d'"), std::string::npos);
  EXPECT_NE(rec.rejected[0].reason.find("NaN"), std::string::npos);
  EXPECT_NE(rec.rejected[1].reason.find("3 elements"), std::string::npos);
  EXPECT_NE(rec.rejected[2].reason.find("norm 500"), std::string::npos);
  // The record survives a JSON round trip (it is the report and the checkpoint's history).
  const RoundRecord back = record_from_json(rec.to_json());
  EXPECT_EQ(back.to_json(), rec.to_json());
}

// A client that had gone away before the request left was sent nothing: bytes_down counts only
// what reached a client.
TEST(Rounds, BytesDownCountsOnlyRequestsThatWereSent) {
  class Unreachable : public Scripted {
   public:
    using Scripted::Scripted;
    bool last_request_sent() const override { return false; }
  };
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::ones({10}), 1));
  c.push_back(std::make_unique<Scripted>("b", torch::ones({10}), 1));
  c.push_back(std::make_unique<Unreachable>("gone", torch::ones({10}), 1, /*fail_at=*/0));
  RoundRunner run(all_clients(2), torch::zeros({10}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok) << rec.failure;
  EXPECT_EQ(rec.bytes_down, 2 * 10 * 4);
}

// A run in which no round succeeded did nothing to the model; it must not look like success.
TEST(Rounds, ARunWhoseRoundsAllFailedIsAnError) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 2; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::ones({4}), 1, /*fail_at=*/0));
  RoundRunner run(all_clients(2), torch::zeros({4}), false);
  run.run_round(ptrs(c));
  run.run_round(ptrs(c));
  try {
    require_a_successful_round(run);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every one of the 2 round(s) failed"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.exit_code(), 1);
  }
  c.push_back(std::make_unique<Scripted>("ok1", torch::ones({4}), 1));
  c.push_back(std::make_unique<Scripted>("ok2", torch::ones({4}), 1));
  ASSERT_TRUE(run.run_round(ptrs(c)).ok);
  EXPECT_NO_THROW(require_a_successful_round(run));
}

TEST(Rounds, TooFewUsableUpdatesFailTheRoundAndKeepTheModel) {
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::tensor({1.f}), 1));
  c.push_back(std::make_unique<Scripted>("b", torch::tensor({2.f}), 1, 0));
  c.push_back(std::make_unique<Scripted>("c", torch::tensor({INFINITY}), 1));
  RoundRunner run(all_clients(2), torch::tensor({7.f}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  EXPECT_FALSE(rec.ok);
  EXPECT_NE(rec.failure.find("min_clients is 2"), std::string::npos);
  EXPECT_TRUE(rec.counted.empty());
  EXPECT_TRUE(torch::equal(run.global(), torch::tensor({7.f})));
  EXPECT_EQ(run.rounds_done(), 1);
}

TEST(Rounds, AStepThatWouldOverflowTheModelIsNotTaken) {
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::tensor({3e38f, 1.f}), 1));
  c.push_back(std::make_unique<Scripted>("b", torch::tensor({3e38f, 1.f}), 1));
  RoundRunner run(all_clients(2), torch::tensor({3e38f, 0.f}), false);
  // Each update and their mean are finite; the model plus the mean is not.
  const RoundRecord rec = run.run_round(ptrs(c));
  EXPECT_FALSE(rec.ok);
  EXPECT_NE(rec.failure.find("non-finite"), std::string::npos) << rec.failure;
  EXPECT_TRUE(rec.counted.empty());
  EXPECT_TRUE(torch::equal(run.global(), torch::tensor({3e38f, 0.f})));
}

TEST(Rounds, MedianResistsAttackersTheMeanFollows) {
  auto make = [](std::vector<std::unique_ptr<Scripted>>& c) {
    for (int i = 0; i < 3; ++i)
      c.push_back(
          std::make_unique<Scripted>(str_cat("h", i), torch::full({4}, 1.0f + 0.1f * i), 1));
    for (int i = 0; i < 2; ++i)
      c.push_back(std::make_unique<Scripted>(str_cat("x", i), torch::full({4}, -100.f), 1));
  };
  std::vector<std::unique_ptr<Scripted>> c1, c2;
  make(c1);
  make(c2);
  FederatedOptions o = all_clients();
  RoundRunner mean(o, torch::zeros({4}), false);
  mean.run_round(ptrs(c1));
  o.aggregator = "median";
  RoundRunner med(o, torch::zeros({4}), false);
  med.run_round(ptrs(c2));
  EXPECT_TRUE(torch::allclose(mean.global(), torch::full({4}, (3.3f - 200.f) / 5)));
  // Sorted per coordinate: -100, -100, 1.0, 1.1, 1.2 — the median is an honest value.
  EXPECT_TRUE(torch::allclose(med.global(), torch::full({4}, 1.0f)));
}

TEST(Rounds, CentralDpClipsAddsNoiseOfSigmaCAndCountsEpsilon) {
  const int64_t n = 200000;
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 4; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::full({n}, 0.01f * (i + 1)), 5));
  FederatedOptions o = all_clients();
  o.dp = DpMode::kCentral;
  o.dp_clip = 2.0;
  o.dp_noise_multiplier = 1.5;
  o.fraction = 1.0;
  RoundRunner run(o, torch::zeros({n}), false);
  const RoundRecord r1 = run.run_round(ptrs(c));
  ASSERT_TRUE(r1.ok);
  // Each update has norm 0.01 (i+1) sqrt(n) > 2, so it is clipped to norm 2: every coordinate
  // 2 / sqrt(n). The mean of the 4 clipped updates is that; noise std on the mean 1.5 * 2 / 4.
  const at::Tensor g = run.global().to(at::kDouble);
  EXPECT_NEAR(g.mean().item<double>(), 2.0 / std::sqrt(double(n)), 0.01);
  EXPECT_NEAR(g.std().item<double>(), 1.5 * 2.0 / 4, 0.01);
  EXPECT_DOUBLE_EQ(r1.epsilon, privacy_spent(1.5, 1.0, 1, 1e-5).epsilon);
  const RoundRecord r2 = run.run_round(ptrs(c));
  EXPECT_DOUBLE_EQ(r2.epsilon, privacy_spent(1.5, 1.0, 2, 1e-5).epsilon);
  EXPECT_GT(r2.epsilon, r1.epsilon);
}

// The example: 20 clients, fraction 0.1, min_clients 5. The cohort min_clients asks for
// is a quarter of the clients, so the round samples at q = 0.25 and is charged at 0.25 —
// `krab privacy epsilon --noise-multiplier 1 --sampling-rate 0.25 --steps 1 --delta 1e-5`
// prints 3.08082, not the 2.133 of q = 0.1.
TEST(Rounds, CentralDpChargesTheRateItSampledAt) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 20; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::full({4}, 0.1f), 5));
  FederatedOptions o = all_clients(5);
  o.fraction = 0.1;
  o.dp = DpMode::kCentral;
  o.dp_noise_multiplier = 1.0;
  RoundRunner run(o, torch::zeros({4}), false);
  const RoundRecord r1 = run.run_round(ptrs(c));
  EXPECT_DOUBLE_EQ(r1.sampling_rate, 0.25);
  EXPECT_EQ(r1.available, 20);
  EXPECT_NEAR(r1.epsilon, 3.08082, 1e-5);
  EXPECT_DOUBLE_EQ(r1.epsilon, privacy_spent(1.0, 0.25, 1, 1e-5).epsilon);
  const RoundRecord r2 = run.run_round(ptrs(c));
  EXPECT_DOUBLE_EQ(r2.epsilon, privacy_spent(1.0, 0.25, 2, 1e-5).epsilon);
  nlohmann::json report;
  add_history(report, run);
  EXPECT_DOUBLE_EQ(report["epsilon"].get<double>(), r2.epsilon);
  EXPECT_EQ(report["rounds"][0]["sampling_rate"].get<double>(), 0.25);
}

// Poisson cohorts vary in size, and the noised sum is divided by the expected size q * n (a
// public number), never by the count that happened to be sampled.
TEST(Rounds, CentralDpCohortsArePoissonAndTheDenominatorIsTheExpectedSize) {
  const int64_t dim = 100000;
  std::vector<std::unique_ptr<Scripted>> c;
  // Norm 1 each (clip 1 leaves them alone): every coordinate 1 / sqrt(dim).
  for (int i = 0; i < 10; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i),
                                           torch::full({dim}, 1.f / std::sqrt(float(dim))), 5));
  FederatedOptions o = all_clients(1);
  o.fraction = 0.5;
  o.dp = DpMode::kCentral;
  o.dp_clip = 1.0;
  o.dp_noise_multiplier = 0.05;
  std::set<size_t> sizes;
  // 30 rounds: the chance that Binomial(10, 0.5) shows fewer than 3 sizes is below 1e-10.
  for (int round = 0; round < 30; ++round) {
    RoundRunner run(o, torch::zeros({dim}), false);
    const RoundRecord rec = run.run_round(ptrs(c));
    ASSERT_TRUE(rec.ok) << rec.failure;
    sizes.insert(rec.cohort.size());
    EXPECT_EQ(rec.counted, rec.cohort);
    // global = (k u + N(0, 0.05^2)) / (0.5 * 10): mean k / 5 / sqrt(dim), sd 0.05 / 5. Scaled
    // by sqrt(dim) the mean is k / 5 with noise sd 0.01; a denominator of k instead of 5
    // would give 1 for every k.
    const at::Tensor g = run.global().to(at::kDouble);
    const double k = static_cast<double>(rec.cohort.size());
    EXPECT_NEAR(g.mean().item<double>() * std::sqrt(double(dim)), k / 5, 0.06) << k;
    EXPECT_NEAR(g.std().item<double>(), 0.01, 0.0005);
  }
  EXPECT_GE(sizes.size(), 3u) << "a fixed-size cohort is not Poisson sampling";
}

// A failed round drew a cohort and is charged; the report carries epsilon even then.
TEST(Rounds, FailedDpRoundsAreChargedAndReported) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 3; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::ones({4}), 1, /*fail_at=*/0));
  FederatedOptions o = all_clients(2);
  o.dp = DpMode::kLocal;
  o.dp_noise_multiplier = 2.0;
  RoundRunner run(o, torch::zeros({4}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_FALSE(rec.ok);
  // Local DP: no amplification against the server; each client was asked once.
  EXPECT_DOUBLE_EQ(rec.epsilon, privacy_spent(2.0, 1.0, 1, 1e-5).epsilon);
  nlohmann::json report;
  add_history(report, run);
  ASSERT_TRUE(report.contains("epsilon"));
  EXPECT_DOUBLE_EQ(report["epsilon"].get<double>(), rec.epsilon);
}

// Cohorts come from a secure source, with DP or without: two runs with the same train.seed
// (which every client is sent) draw different cohorts. Only fl-sim may ask for cohorts that
// follow the seed (seeded_cohorts), and then only without DP.
TEST(Rounds, CohortsCannotBePredictedFromTheSeed) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 20; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::ones({2}), 1));
  for (bool seeded : {false, true})
    for (const char* dp : {"none", "local", "central"}) {
      FederatedOptions o = all_clients(2);
      o.fraction = 0.25;
      o.dp = parse_dp_mode(dp);
      o.seed = 7;
      o.seeded_cohorts = seeded;
      RoundRunner a(o, torch::zeros({2}), false), b(o, torch::zeros({2}), false);
      int same = 0;
      for (int r = 0; r < 8; ++r)
        same += a.run_round(ptrs(c)).cohort == b.run_round(ptrs(c)).cohort;
      if (seeded && std::string(dp) == "none")
        EXPECT_EQ(same, 8);
      else
        EXPECT_LE(same, 1) << dp << seeded;  // 15504 possible 5-of-20 cohorts (more for Poisson)
    }
}

TEST(Rounds, LocalDpChargesTheMostAskedClientAtRateOne) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 4; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::ones({4}), 1));
  FederatedOptions o = all_clients(1);
  o.fraction = 0.5;
  o.dp = DpMode::kLocal;
  o.dp_noise_multiplier = 3.0;
  RoundRunner run(o, torch::zeros({4}), false);
  std::map<std::string, int64_t> asked;
  RoundRecord rec;
  for (int r = 0; r < 6; ++r) {
    rec = run.run_round(ptrs(c));
    for (const auto& id : rec.cohort) ++asked[id];
  }
  int64_t worst = 0;
  for (const auto& [id, n] : asked) worst = std::max(worst, n);
  EXPECT_DOUBLE_EQ(rec.epsilon, privacy_spent(3.0, 1.0, worst, 1e-5).epsilon);
}

TEST(Rounds, ANoiseMultiplierWithNoFiniteEpsilonIsRefusedByKey) {
  for (const char* sigma : {"0", "1e-300"}) {
    core::Config c;
    c.set("federated.dp", "central");
    c.set("federated.dp_noise_multiplier", sigma);
    try {
      FederatedOptions::from_config(c);
      ADD_FAILURE() << sigma << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("federated.dp_noise_multiplier"), std::string::npos)
          << e.what();
    }
  }
}

// Resuming replays the budget from the records; earlier rounds without noise cannot be charged.
TEST(Rounds, ResumeReplaysTheBudgetAndRefusesNonPrivateHistory) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 6; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::ones({4}), 1));
  FederatedOptions o = all_clients(3);
  o.fraction = 0.2;
  o.dp = DpMode::kCentral;
  RoundRunner a(o, torch::zeros({4}), false);
  a.run_round(ptrs(c));
  a.run_round(ptrs(c));
  RoundRunner b(o, torch::zeros({4}), false);
  b.restore(a.global(), a.rounds_done(), a.history());
  EXPECT_DOUBLE_EQ(a.run_round(ptrs(c)).epsilon, b.run_round(ptrs(c)).epsilon);

  FederatedOptions plain = all_clients(3);
  RoundRunner p(plain, torch::zeros({4}), false);
  p.run_round(ptrs(c));
  RoundRunner d(o, torch::zeros({4}), false);
  EXPECT_THROW(d.restore(p.global(), p.rounds_done(), p.history()), InvalidArgument);
}

TEST(Rounds, RobustAggregatorWithSecureAggregationIsRefused) {
  core::Config c;
  c.set("federated.secure_aggregation", "true");
  c.set("federated.aggregator", "median");
  try {
    FederatedOptions::from_config(c);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("federated.aggregator 'median'"), std::string::npos);
  }
}

// Secure rounds: the sum the server unmasks equals the plain weighted mean of the clients that
// made it through, with dropouts before training and in each protocol stage.
TEST(Rounds, SecureAggregationMatchesThePlainMeanDespiteDropouts) {
  torch::manual_seed(1);
  const int64_t m = 1000;
  std::vector<at::Tensor> u;
  for (int i = 0; i < 10; ++i) u.push_back(torch::randn({m}) * 0.3);
  const std::vector<int> fail_at = {-1, 0, -1, 1, -1, 2, -1, 3, -1, -1};
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 10; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), u[i], 10 + i, fail_at[i]));
  FederatedOptions o = all_clients(2);
  o.secure = true;
  o.secagg_threshold = 0.6;  // t = 6 of 10
  RoundRunner run(o, torch::zeros({m}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok) << rec.failure;
  // Counted: everyone who sent a masked input — all but c1 (before fit), c3 (stage 1) and c5
  // (stage 2). c7 dropped in stage 3 but its masked input is in the sum.
  EXPECT_EQ(rec.counted, (std::vector<std::string>{"c0", "c2", "c4", "c6", "c7", "c8", "c9"}));
  at::Tensor want = torch::zeros({m});
  double total = 0;
  for (int i : {0, 2, 4, 6, 7, 8, 9}) {
    want += u[i] * (10 + i);
    total += 10 + i;
  }
  want /= total;
  EXPECT_LT((run.global() - want).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(rec.dropped.size(), 4u);
}

// A secure-aggregation client that claims an id other than the one the server gave its
// connection: a huge id, one past the cohort, or another client's. It must neither crash the
// server, nor get another client rejected, nor have its update credited to another name.
class Impostor : public Scripted {
 public:
  Impostor(std::string id, at::Tensor update, uint64_t claim, int lie_at)
      : Scripted(std::move(id), std::move(update), 1), claim_(claim), lie_at_(lie_at) {}
  FitReply fit(const FitInstruction& ins) override {
    FitInstruction mine = ins;
    if (lie_at_ == -1) mine.secagg_id = claim_;  // every message claims the id
    return Scripted::fit(mine);
  }
  std::vector<uint8_t> secagg(const SecAggRequest& req) override {
    std::vector<uint8_t> out = Scripted::secagg(req);
    if (req.stage == SecAggRequest::kMaskedInput && lie_at_ == 2) {
      auto msg = secagg::MaskedInput::from_bytes(out);
      msg.client_id = claim_;
      out = msg.to_bytes();
    }
    return out;
  }

 private:
  uint64_t claim_;
  int lie_at_;
};

TEST(Rounds, SecureAggregationTrustsOnlyTheIdItAssigned) {
  struct Case {
    uint64_t claim;
    int lie_at;  // -1: from the first message; 2: only in the masked input
  };
  for (const Case k : {Case{1ull << 40, -1}, Case{4, -1}, Case{2, -1}, Case{1, 2}}) {
    std::vector<std::unique_ptr<Scripted>> c;
    c.push_back(std::make_unique<Scripted>("a", torch::full({6}, 1.f), 1));
    c.push_back(std::make_unique<Scripted>("b", torch::full({6}, 3.f), 1));
    // Third in the cohort (ids are positions from 1): its own id is 3.
    c.push_back(std::make_unique<Impostor>("z", torch::full({6}, 100.f), k.claim, k.lie_at));
    FederatedOptions o = all_clients(2);
    o.secure = true;
    o.secagg_threshold = 0.6;  // t = 2 of 3
    RoundRunner run(o, torch::zeros({6}), false);
    const RoundRecord rec = run.run_round(ptrs(c));
    ASSERT_TRUE(rec.ok) << k.claim << ": " << rec.failure;
    EXPECT_EQ(rec.counted, (std::vector<std::string>{"a", "b"})) << k.claim;
    EXPECT_TRUE(torch::allclose(run.global(), torch::full({6}, 2.f), 1e-4, 1e-4))
        << k.claim << ": " << run.global();
    bool named = false;
    for (const auto& r : k.lie_at == -1 ? rec.rejected : rec.dropped)
      named |= r.client == "z" && r.reason.find("claims client id") != std::string::npos;
    EXPECT_TRUE(named) << k.claim;
  }
}

TEST(Rounds, ATruncatedSecureMessageDropsOnlyItsSender) {
  std::vector<at::Tensor> u = {torch::full({16}, 1.f), torch::full({16}, 2.f),
                               torch::full({16}, 3.f), torch::full({16}, 4.f)};
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 4; ++i) c.push_back(std::make_unique<Scripted>(str_cat("c", i), u[i], 1));
  c[2]->truncate_at_ = SecAggRequest::kMaskedInput;
  FederatedOptions o = all_clients(2);
  o.secure = true;
  o.secagg_threshold = 0.5;
  RoundRunner run(o, torch::zeros({16}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok) << rec.failure;
  EXPECT_EQ(rec.counted, (std::vector<std::string>{"c0", "c1", "c3"}));
  ASSERT_EQ(rec.dropped.size(), 1u);
  EXPECT_EQ(rec.dropped[0].client, "c2");
  EXPECT_LT((run.global() - torch::full({16}, 7.f / 3)).abs().max().item<double>(), 1e-5);
}

TEST(Rounds, SecureAggregationFailsCleanlyBelowTheThreshold) {
  std::vector<std::unique_ptr<Scripted>> c;
  for (int i = 0; i < 5; ++i)
    c.push_back(std::make_unique<Scripted>(str_cat("c", i), torch::ones({8}), 1, i < 3 ? 2 : -1));
  FederatedOptions o = all_clients(2);
  o.secure = true;
  o.secagg_threshold = 0.6;  // t = 3; only 2 send masked inputs
  RoundRunner run(o, torch::full({8}, 3.f), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  EXPECT_FALSE(rec.ok);
  EXPECT_NE(rec.failure.find("secure aggregation"), std::string::npos) << rec.failure;
  EXPECT_TRUE(torch::equal(run.global(), torch::full({8}, 3.f)));
}

// A client's example count is its weight and is self-reported: a bound keeps one client from
// claiming the mean for itself, in plain and in secure rounds.
TEST(Rounds, AnExampleCountAboveTheBoundIsRejected) {
  for (bool secure : {false, true}) {
    std::vector<std::unique_ptr<Scripted>> c;
    c.push_back(std::make_unique<Scripted>("a", torch::full({4}, 1.f), 100));
    c.push_back(std::make_unique<Scripted>("b", torch::full({4}, 3.f), 100));
    c.push_back(std::make_unique<Scripted>("greedy", torch::full({4}, 50.f), 1000000000));
    FederatedOptions o = all_clients(2);
    o.secure = secure;
    o.secagg_threshold = 0.6;
    o.max_client_examples = 1000;
    RoundRunner run(o, torch::zeros({4}), false);
    const RoundRecord rec = run.run_round(ptrs(c));
    ASSERT_TRUE(rec.ok) << rec.failure;
    EXPECT_EQ(rec.counted, (std::vector<std::string>{"a", "b"})) << secure;
    ASSERT_EQ(rec.rejected.size(), 1u);
    EXPECT_NE(rec.rejected[0].reason.find("federated.max_client_examples"), std::string::npos);
    EXPECT_TRUE(torch::allclose(run.global(), torch::full({4}, 2.f), 1e-4, 1e-4)) << secure;
  }
}

// A client's own minimums hold whatever the server asks (client_policy.h).
TEST(ClientPolicy, TheServersRequestIsCheckedAgainstTheClientsFlags) {
  auto error_of = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  FitInstruction ins;
  ins.round = 3;
  ClientPolicy open;
  EXPECT_EQ(error_of([&] { check_fit(open, ins); }), "");
  ClientPolicy strict;
  strict.require_secure = true;
  strict.min_local_noise = 1.0;
  strict.max_clip = 2.0;
  strict.max_weight = 0.5;
  EXPECT_NE(error_of([&] { check_fit(strict, ins); }).find("--require-secure-aggregation"),
            std::string::npos);
  ins.secure = true;
  ins.secagg_clients = 10;
  ins.secagg_threshold = 5;  // 2t = n: unsafe, refused even without a flag
  EXPECT_NE(error_of([&] { check_fit(open, ins); }).find("2t > n"), std::string::npos);
  ins.secagg_threshold = 6;
  ins.clip_norm = 1.0;
  ins.local_noise_std = 0.5;  // multiplier 0.5 < 1
  EXPECT_NE(error_of([&] { check_fit(strict, ins); }).find("--min-local-noise"), std::string::npos);
  ins.local_noise_std = 1.5;
  ins.clip_norm = 1.5;  // multiplier 1, but...
  ins.local_noise_std = 1.5;
  EXPECT_EQ(error_of([&] { check_fit(strict, ins); }), "");
  ins.clip_norm = 3.0;  // ...clip 3 > --max-clip 2
  ins.local_noise_std = 3.0;
  EXPECT_NE(error_of([&] { check_fit(strict, ins); }).find("--max-clip"), std::string::npos);
  EXPECT_EQ(error_of([&] { check_weight(strict, 0.2); }), "");
  EXPECT_NE(error_of([&] { check_weight(strict, 1.0); }).find("--max-weight"), std::string::npos);
  EXPECT_EQ(error_of([&] { check_weight(open, 1.0); }), "");
}

// Client names are the tokens file's and need not be UTF-8: the state file and the report are
// written anyway (the bytes replaced), never lost to a JSON library error after the round.
TEST(ServerState, ClientNamesThatAreNotUtf8AreWrittenReplaced) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("krab-flutf8-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("caf\xe9", torch::ones({2}), 1));
  c.push_back(std::make_unique<Scripted>("b", torch::ones({2}), 1));
  RoundRunner run(all_clients(), torch::zeros({2}), false);
  ASSERT_TRUE(run.run_round(ptrs(c)).ok);
  const std::string path = state_path(dir.string());
  EXPECT_NO_THROW(save_server_state(path, run, "sig"));
  RoundRunner back(all_clients(), torch::zeros({2}), false);
  ASSERT_TRUE(load_server_state(path, back, "sig"));
  EXPECT_EQ(back.history()[0].cohort[1], "caf\xef\xbf\xbd");  // U+FFFD; "b" sorts first
  nlohmann::json report;
  add_history(report, run);
  EXPECT_NE(core::dump_json(report).find("caf\xef\xbf\xbd"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ServerState, RoundTripAndRefusesCorruptFiles) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("krab-flstate-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = state_path(dir.string());
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::tensor({1.f, -1.f}), 3));
  c.push_back(std::make_unique<Scripted>("b", torch::tensor({2.f, 0.5f}), 1));
  FederatedOptions o = all_clients();
  o.strategy = "fedadam";
  o.strategy_options.eta = 0.1;
  RoundRunner a(o, torch::zeros({2}), false);
  a.run_round(ptrs(c));
  a.run_round(ptrs(c));
  save_server_state(path, a, "sig");

  RoundRunner b(o, torch::zeros({2}), false);
  ASSERT_TRUE(load_server_state(path, b, "sig"));
  EXPECT_TRUE(torch::equal(a.global(), b.global()));
  EXPECT_EQ(b.rounds_done(), 2);
  ASSERT_EQ(b.history().size(), 2u);
  EXPECT_EQ(b.history()[1].to_json(), a.history()[1].to_json());
  // The next round continues the optimizer (moments restored): same result as the original.
  a.run_round(ptrs(c));
  b.run_round(ptrs(c));
  EXPECT_TRUE(torch::equal(a.global(), b.global()));

  EXPECT_THROW(load_server_state(path, b, "other-model"), InvalidArgument);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  RoundRunner fresh(o, torch::zeros({2}), false);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes.substr(0, bytes.size() - 7);
  }
  EXPECT_THROW(load_server_state(path, fresh, "sig"), CorruptData);
  {
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x20;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << flipped;
  }
  EXPECT_THROW(load_server_state(path, fresh, "sig"), CorruptData);
  EXPECT_EQ(fresh.rounds_done(), 0);
  EXPECT_TRUE(torch::equal(fresh.global(), torch::zeros({2})));
  EXPECT_FALSE(load_server_state((dir / "none.krab").string(), fresh, "sig"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace krab::federated
