// Strategies against hand-computed values: FedAvg's weighted mean, FedAdam/FedYogi's recurrences
// (Reddi et al. 2021, Algorithm 2) recomputed here in plain double arithmetic, checkpointed
// state, the FedProx term against its closed-form gradient, and client sampling.
#include "federated/strategy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"

namespace krab::federated {
namespace {

at::Tensor vec(std::vector<float> v) { return torch::tensor(v); }

std::vector<double> values(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

void expect_values(const at::Tensor& t, const std::vector<double>& want, double tol) {
  const auto got = values(t);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "element " << i;
  }
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

TEST(FedAvg, WeightedMeanOfUpdates) {
  // (1 * [1, 0, -1] + 3 * [3, 6, 3]) / 4 = [2.5, 4.5, 2].
  FedAvg s;
  const at::Tensor global = vec({1, 2, 3});
  const std::vector<ClientResult> r = {{"a", vec({1, 0, -1}), 1}, {"b", vec({3, 6, 3}), 3}};
  expect_values(s.aggregate(global, r), {3.5, 6.5, 5}, 1e-6);
  expect_values(global, {1, 2, 3}, 0);  // input untouched
  // A zero-example client contributes nothing.
  const std::vector<ClientResult> r0 = {{"a", vec({1, 1, 1}), 2}, {"z", vec({100, 100, 100}), 0}};
  expect_values(s.aggregate(global, r0), {2, 3, 4}, 1e-6);
}

TEST(FedAvg, ServerLearningRateScalesTheStep) {
  StrategyOptions o;
  o.server_lr = 0.5;
  auto s = make_strategy("fedavg", o);
  const std::vector<ClientResult> r = {{"a", vec({2, -4}), 5}};
  expect_values(s->aggregate(vec({0, 0}), r), {1, -2}, 1e-6);
}

TEST(FedAvg, RejectsBadResultsNamingTheClient) {
  FedAvg s;
  const at::Tensor g = vec({0, 0});
  EXPECT_NE(error_of([&] {
              s.aggregate(g, {{"a", vec({1, 1}), 0}, {"b", vec({1, 1}), 0}});
            }).find("0 examples in total"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              s.aggregate(g, {{"c9", vec({1, 1, 1}), 4}});
            }).find("client 'c9'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              s.aggregate(g, {{"neg", vec({1, 1}), -2}});
            }).find("client 'neg'"),
            std::string::npos);
  EXPECT_THROW(s.aggregate(g, {}), InvalidArgument);
  EXPECT_THROW(s.aggregate(vec({0, 0}).to(at::kDouble), {{"a", vec({1, 1}), 1}}), InvalidArgument);
}

// Reddi et al. Algorithm 2 for one coordinate, in double.
struct Reference {
  bool yogi;
  double eta, b1, b2, tau;
  double x, m = 0, v;
  void round(double delta) {
    m = b1 * m + (1 - b1) * delta;
    const double d2 = delta * delta;
    if (yogi) {
      const double s = v - d2 > 0 ? 1 : (v - d2 < 0 ? -1 : 0);
      v = v - (1 - b2) * d2 * s;
    } else {
      v = b2 * v + (1 - b2) * d2;
    }
    x = x + eta * m / (std::sqrt(v) + tau);
  }
};

void check_adaptive(const std::string& name, bool yogi) {
  StrategyOptions o;
  o.eta = 0.1;  // b1 = 0.9, b2 = 0.99, tau = 1e-3: the paper's defaults
  auto s = make_strategy(name, o);
  EXPECT_EQ(s->name(), name);
  // Coordinates chosen so that Yogi's sign(v - delta^2) takes every value: delta^2 above v0 =
  // tau^2 = 1e-6 (0.5, -2), below it (1e-4), and delta = 0 (v unchanged).
  const std::vector<double> x0 = {1.0, -1.0, 0.5, 2.0};
  const std::vector<std::vector<double>> client1 = {{0.4, -2.5, 1e-4, 0}, {0.6, -1.5, 3e-4, 0}};
  const std::vector<std::vector<double>> client2 = {{-0.2, 0.1, 2e-4, 0}, {0.1, 0.3, -1e-4, 0}};
  const std::vector<int64_t> n = {3, 1};
  std::vector<Reference> ref;
  for (double x : x0) ref.push_back({yogi, 0.1, 0.9, 0.99, 1e-3, x, 0, 1e-6});

  auto results = [&](const std::vector<std::vector<double>>& u) {
    std::vector<ClientResult> r;
    for (size_t k = 0; k < u.size(); ++k) {
      std::vector<float> f(u[k].begin(), u[k].end());
      r.push_back({"c" + std::to_string(k), vec(f), n[k]});
    }
    return r;
  };
  auto reference_round = [&](const std::vector<std::vector<double>>& u) {
    std::vector<double> want;
    for (size_t i = 0; i < ref.size(); ++i) {
      // float32 rounding of the inputs, as the strategy sees them.
      const double d = (3 * static_cast<double>(static_cast<float>(u[0][i])) +
                        static_cast<double>(static_cast<float>(u[1][i]))) /
                       4;
      ref[i].round(d);
      want.push_back(ref[i].x);
    }
    return want;
  };

  std::vector<float> xf(x0.begin(), x0.end());
  at::Tensor x = s->aggregate(vec(xf), results(client1));
  expect_values(x, reference_round(client1), 1e-5);
  x = s->aggregate(x, results(client2));
  expect_values(x, reference_round(client2), 1e-5);
  EXPECT_EQ(s->state().at("rounds").item<int64_t>(), 2);
  // The second moment, too: it is what Adam and Yogi disagree on.
  std::vector<double> v_want;
  for (const auto& r : ref) v_want.push_back(r.v);
  expect_values(s->state().at("v"), v_want, 1e-4);
}

TEST(FedAdaptive, FedAdamMatchesAlgorithm2) { check_adaptive("fedadam", false); }
TEST(FedAdaptive, FedYogiMatchesAlgorithm2) { check_adaptive("fedyogi", true); }

TEST(FedAdaptive, FirstAdamStepByHand) {
  // v starts at tau^2 = 1e-6. With one client, d = 1 and eta = 0.1:
  // m = 0.1, v = 0.99e-6 + 0.01, x = 0.1 * 0.1 / (sqrt(0.01000099) + 0.001) = 0.09900...
  StrategyOptions o;
  o.eta = 0.1;
  FedAdaptive s(FedAdaptive::Variant::kAdam, o);
  const at::Tensor x = s.aggregate(vec({0}), {{"a", vec({1}), 1}});
  EXPECT_NEAR(x.item<float>(), 0.1 * 0.1 / (std::sqrt(0.99e-6 + 0.01) + 1e-3), 1e-6);
  // initial_v overrides the paper's v0 (Flower starts from 0).
  o.initial_v = 0.0;
  FedAdaptive z(FedAdaptive::Variant::kAdam, o);
  EXPECT_NEAR(z.aggregate(vec({0}), {{"a", vec({1}), 1}}).item<float>(),
              0.1 * 0.1 / (std::sqrt(0.01) + 1e-3), 1e-6);
}

TEST(FedAdaptive, StateRoundTripsThroughACheckpoint) {
  const std::vector<ClientResult> r1 = {{"a", vec({0.5, -1, 2}), 2}, {"b", vec({1, 1, 1}), 1}};
  const std::vector<ClientResult> r2 = {{"a", vec({-0.5, 0.25, 0}), 1}};
  for (const char* name : {"fedadam", "fedyogi"}) {
    auto a = make_strategy(name);
    const at::Tensor x1 = a->aggregate(vec({0, 0, 0}), r1);
    // Through torch's own serialisation, as a checkpoint would store it.
    std::map<std::string, at::Tensor> restored;
    for (const auto& [k, t] : a->state()) {
      std::stringstream buf;
      torch::save(t, buf);
      torch::load(restored[k], buf);
    }
    auto b = make_strategy(name);
    b->load_state(restored);
    EXPECT_TRUE(at::equal(a->aggregate(x1, r2), b->aggregate(x1, r2))) << name;
    EXPECT_EQ(b->state().at("rounds").item<int64_t>(), 2);
  }
  auto s = make_strategy("fedadam");
  EXPECT_THROW(s->load_state({}), InvalidArgument);  // no "rounds"
  EXPECT_THROW(s->load_state({{"rounds", at::tensor(1L)}, {"m", at::zeros({3})}}),
               InvalidArgument);  // m without v
  // State of a 3-parameter model cannot drive a 2-parameter one.
  s->load_state({{"rounds", at::tensor(1L)}, {"m", at::zeros({3})}, {"v", at::ones({3})}});
  EXPECT_THROW(s->aggregate(vec({0, 0}), {{"a", vec({1, 1}), 1}}), InvalidArgument);
}

TEST(Strategy, FactoryKnowsItsNames) {
  for (const char* n : {"fedavg", "fedprox", "fedadam", "fedyogi"}) {
    EXPECT_EQ(make_strategy(n)->name(), n);
  }
  StrategyOptions o;
  o.proximal_mu = 0.3;
  auto prox = make_strategy("fedprox", o);
  EXPECT_DOUBLE_EQ(dynamic_cast<FedProx&>(*prox).mu(), 0.3);
  const std::string e = error_of([] { make_strategy("fedsgd"); });
  EXPECT_NE(e.find("'fedsgd'"), std::string::npos) << e;
  EXPECT_NE(e.find("fedavg, fedprox, fedadam, fedyogi"), std::string::npos) << e;
  o.beta2 = 1.0;
  EXPECT_NE(error_of([&] { make_strategy("fedyogi", o); }).find("beta2"), std::string::npos);
}

TEST(FedProx, PenaltyAndGradientAreTheProximalTerm) {
  const double mu = 0.2;
  const std::vector<at::Tensor> global = {vec({1, 2}), vec({0.5})};
  std::vector<at::Tensor> w = {vec({2, 0}).requires_grad_(), vec({1.5}).requires_grad_()};
  // mu/2 ||w - w_g||^2 = 0.1 * (1 + 4 + 1) = 0.6; gradient mu (w - w_g) = [0.2, -0.4], [0.2].
  at::Tensor p = fedprox_penalty(w, global, mu);
  EXPECT_EQ(p.dim(), 0);
  EXPECT_NEAR(p.item<double>(), 0.6, 1e-6);
  p.backward();
  expect_values(w[0].grad(), {0.2, -0.4}, 1e-6);
  expect_values(w[1].grad(), {0.2}, 1e-6);

  // The gradient form adds the same amount to existing gradients and creates missing ones.
  std::vector<at::Tensor> w2 = {vec({2, 0}).requires_grad_(), vec({1.5}).requires_grad_()};
  w2[0].mutable_grad() = vec({1, 1});
  fedprox_add_grad(w2, global, mu);
  expect_values(w2[0].grad(), {1.2, 0.6}, 1e-6);
  expect_values(w2[1].grad(), {0.2}, 1e-6);

  EXPECT_THROW(fedprox_penalty(w, {vec({1, 2})}, mu), InvalidArgument);
  EXPECT_THROW(fedprox_penalty(w, {vec({1, 2, 3}), vec({0})}, mu), InvalidArgument);
  EXPECT_THROW(fedprox_add_grad(w, global, -1), InvalidArgument);
}

std::vector<std::string> ids(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("client-" + std::to_string(100 + i));
  return v;
}

TEST(SampleClients, DeterministicAndSized) {
  const auto all = ids(20);
  const auto a = sample_clients(all, 0.3, 2, 7, 42);
  EXPECT_EQ(a.size(), 6u);  // floor(0.3 * 20) = 6 > min 2
  EXPECT_EQ(a, sample_clients(all, 0.3, 2, 7, 42));
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<std::string>(a.begin(), a.end()).size(), a.size());
  for (const auto& id : a) EXPECT_NE(std::find(all.begin(), all.end(), id), all.end());
  // The order the clients connected in does not matter.
  auto shuffled = all;
  std::reverse(shuffled.begin(), shuffled.end());
  EXPECT_EQ(a, sample_clients(shuffled, 0.3, 2, 7, 42));
  // min_clients wins over a small fraction; fraction 1 takes everyone.
  EXPECT_EQ(sample_clients(all, 0.01, 4, 1, 42).size(), 4u);
  EXPECT_EQ(sample_clients(all, 1.0, 1, 1, 42), all);
  EXPECT_EQ(sample_clients(ids(100), 0.29, 1, 1, 1).size(), 29u);  // not 28 from rounding
  // Another round or seed gives another cohort (with 38760 possible cohorts, a repeat across
  // all of these would mean the round is ignored).
  int same = 0;
  for (int r = 0; r < 10; ++r) same += sample_clients(all, 0.3, 2, r, 42) == a;
  EXPECT_LE(same, 2);
  EXPECT_NE(sample_clients(all, 0.3, 2, 7, 43), a);
}

TEST(SampleClients, EveryClientIsPickedAboutEquallyOften) {
  const auto all = ids(10);
  std::map<std::string, int> count;
  for (int r = 0; r < 1000; ++r) {
    for (const auto& id : sample_clients(all, 0.3, 1, r, 5)) ++count[id];
  }
  // Each round picks 3 of 10: expected 300 picks per client, sd ~14.5.
  for (const auto& id : all) {
    EXPECT_GT(count[id], 300 - 70) << id;
    EXPECT_LT(count[id], 300 + 70) << id;
  }
}

TEST(SampleClients, RejectsImpossibleRequests) {
  const std::string e = error_of([] { sample_clients(ids(3), 0.5, 5, 0, 1); });
  EXPECT_NE(e.find("min_clients is 5"), std::string::npos) << e;
  EXPECT_NE(e.find("only 3"), std::string::npos) << e;
  EXPECT_THROW(sample_clients(ids(3), 0.0, 1, 0, 1), InvalidArgument);
  EXPECT_THROW(sample_clients(ids(3), 1.5, 1, 0, 1), InvalidArgument);
  EXPECT_THROW(sample_clients(ids(3), 0.5, 0, 0, 1), InvalidArgument);
  EXPECT_NE(error_of([] {
              sample_clients({"a", "b", "a"}, 0.5, 1, 0, 1);
            }).find("'a'"),
            std::string::npos);
}

// A reproducible stand-in for the secure source the server uses (splitmix64).
std::function<uint64_t()> counter_source(uint64_t seed) {
  return [state = seed]() mutable {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
}

// Poisson sampling is what the DP accountant assumes: each client in independently with
// probability q, so the cohort's size is Binomial(n, q), not a fixed count.
TEST(PoissonSampleClients, SizesAreBinomialAndEachClientIsInWithProbabilityQ) {
  const auto all = ids(40);
  const double q = 0.25;
  const int rounds = 4000;
  auto source = counter_source(11);
  std::map<std::string, int> count;
  std::map<size_t, int> sizes;
  double sum = 0, sum2 = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto c = poisson_sample_clients(all, q, source);
    EXPECT_TRUE(std::is_sorted(c.begin(), c.end()));
    for (const auto& id : c) ++count[id];
    ++sizes[c.size()];
    sum += static_cast<double>(c.size());
    sum2 += static_cast<double>(c.size() * c.size());
  }
  const double mean = sum / rounds, var = sum2 / rounds - mean * mean;
  // Binomial(40, 0.25): mean 10, variance 7.5. The sample mean's sd is sqrt(7.5 / 4000) = 0.043.
  EXPECT_NEAR(mean, 10.0, 0.2);
  EXPECT_NEAR(var, 7.5, 0.75);
  // P(size = 10) = C(40,10) 0.25^10 0.75^30 = 0.1444; P(size = 5) = 0.0272.
  EXPECT_NEAR(sizes[10] / double(rounds), 0.1444, 0.02);
  EXPECT_NEAR(sizes[5] / double(rounds), 0.0272, 0.01);
  // Each client: 1000 expected, sd 27.4.
  for (const auto& id : all) EXPECT_NEAR(count[id], 1000, 140) << id;
  // Rate 1 takes everyone; the order they connected in does not matter.
  auto rev = all;
  std::reverse(rev.begin(), rev.end());
  EXPECT_EQ(poisson_sample_clients(rev, 1.0, source), all);
  EXPECT_THROW(poisson_sample_clients(all, 0.0, source), InvalidArgument);
  EXPECT_THROW(poisson_sample_clients({"a", "a"}, 0.5, source), InvalidArgument);
}

TEST(PoissonSampleClients, TheRateIsTheFractionRaisedToMeetMinClients) {
  EXPECT_DOUBLE_EQ(dp_sampling_rate(0.1, 5, 20), 0.25);  // the cohort min_clients asks for
  EXPECT_DOUBLE_EQ(dp_sampling_rate(0.3, 2, 20), 0.3);
  EXPECT_DOUBLE_EQ(dp_sampling_rate(0.1, 50, 20), 1.0);
  EXPECT_THROW(dp_sampling_rate(0.1, 1, 0), InvalidArgument);
}

}  // namespace
}  // namespace krab::federated
