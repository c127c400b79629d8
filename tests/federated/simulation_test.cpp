// Local training against autograd done here, and whole fl-sim runs on synthetic data: they
// learn, account bytes as the model size says, resume exactly, and give the same model with
// secure aggregation as without it.
#include "federated/simulation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/config.h"
#include "core/errors.h"
#include "federated/local_training.h"
#include "train/job.h"

namespace krab::federated {
namespace {

class SimDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           str_cat("krab-flsim-", ::getpid(), "-",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  core::Config job(const std::string& extra = "") const {
    return core::Config::parse(str_cat(R"(
name: sim
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4000, synthetic_features: 16, synthetic_classes: 4, batch_size: 32}
train: {seed: 7, optimizer: {name: sgd, lr: 0.05, momentum: 0}}
federated: {clients: 10, fraction: 0.5, min_clients: 2, rounds: 6}
checkpoint: {dir: )",
                                       (dir_ / "run").string(), "}\n", extra),
                               "test");
  }

  std::filesystem::path dir_;
};

TEST_F(SimDir, OneLocalStepIsMinusLrTimesTheGradient) {
  core::Config c = job("federated.local_steps: 1\n");
  c.set("data.batch_size", "3600");
  c.set("train.optimizer.lr", "0.1");
  const data::DataSplits d = train::load_data(c);
  const models::ModelSpec spec = train::model_spec(c, d);
  torch::manual_seed(3);
  LocalTrainer trainer(c, spec);
  const at::Tensor global = flatten_parameters(trainer.model());
  RoundOptions ro;
  ro.seed = 1;
  const LocalResult r = trainer.train(global, d.train, ro);
  EXPECT_EQ(r.steps, 1);
  EXPECT_EQ(r.num_examples, d.train.size());

  // Independent: the full-batch gradient at `global` through autograd on a fresh model.
  auto m = models::make_model(spec);
  load_flat_parameters(*m, global);
  m->loss(m->forward(d.train.inputs), d.train.targets).backward();
  std::vector<at::Tensor> g;
  for (const auto& p : m->parameters()) g.push_back(p.grad().reshape(-1));
  const at::Tensor want = torch::cat(g) * -0.1;
  EXPECT_LT((r.update - want).abs().max().item<double>(), 1e-5);

  // Clipping keeps the direction and bounds the norm.
  ro.clip_norm = 0.5 * want.norm().item<double>();
  const LocalResult clipped = trainer.train(global, d.train, ro);
  EXPECT_NEAR(clipped.update.norm().item<double>(), ro.clip_norm, 1e-4);
  EXPECT_GT(torch::cosine_similarity(clipped.update, want, 0).item<double>(), 0.9999);
}

// Diverged local training is a rejected update (named "non-finite"), not a dropout with an
// internal clipping message; with DP on, clipping must not be where it fails. A run whose rounds
// all failed writes its report and then fails.
TEST_F(SimDir, DivergedClientsAreRejectedAndAnAllFailedRunIsAnError) {
  core::Config c = job();
  c.set("federated.rounds", "2");
  c.set("federated.dp", "local");
  c.set("train.optimizer.lr", "1e38");
  const std::string report = (dir_ / "report.json").string();
  try {
    run_simulation(c, SimulationOptions{report, false});
    FAIL() << "a run with no successful round returned normally";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("round(s) failed"), std::string::npos) << e.what();
  }
  std::ifstream in(report);
  const nlohmann::json rep = nlohmann::json::parse(in);
  for (const auto& r : rep["rounds"]) {
    EXPECT_FALSE(r["ok"].get<bool>());
    EXPECT_TRUE(r["dropped"].empty()) << r["dropped"].dump();
    ASSERT_FALSE(r["rejected"].empty());
    EXPECT_NE(r["rejected"][0]["reason"].get<std::string>().find("non-finite"), std::string::npos)
        << r["rejected"].dump();
  }
  EXPECT_TRUE(rep.contains("epsilon"));
}

// With checkpoint.hmac_key_file the server state is sealed: a resumed run reads it back, and a
// state file someone wrote without the key (say, to reset the DP budget) is refused.
TEST_F(SimDir, ASealedServerStateResumesAndAnUnsealedOneIsRefused) {
  { std::ofstream(dir_ / "key") << std::string(64, 'z'); }
  core::Config c = job();
  c.set("federated.rounds", "2");
  c.set("checkpoint.hmac_key_file", (dir_ / "key").string());
  run_simulation(c, SimulationOptions{"", false});
  c.set("federated.rounds", "3");
  c.set("checkpoint.resume", "true");
  const nlohmann::json resumed = run_simulation(c, SimulationOptions{"", false});
  EXPECT_EQ(resumed["rounds"].size(), 3u);
  // The same run's state rewritten without a seal (valid CRC, anything inside) is refused.
  core::Config unsealed = c;
  unsealed.set("checkpoint.hmac_key_file", "");
  unsealed.set("checkpoint.resume", "false");
  unsealed.set("federated.rounds", "1");
  run_simulation(unsealed, SimulationOptions{"", false});
  try {
    run_simulation(c, SimulationOptions{"", false});
    FAIL() << "an unsealed state was resumed";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("carries no seal"), std::string::npos) << e.what();
  }
}

TEST_F(SimDir, FedAvgLearnsAndCountsModelSizedTraffic) {
  const nlohmann::json rep = run_simulation(job(), SimulationOptions{"", false});
  ASSERT_EQ(rep["rounds"].size(), 6u);
  const int64_t params = rep["parameters"].get<int64_t>();
  for (const auto& r : rep["rounds"]) {
    EXPECT_TRUE(r["ok"].get<bool>());
    EXPECT_EQ(r["cohort"].size(), 5u);
    EXPECT_EQ(r["counted"].size(), 5u);
    // Down: the model to each of the 5; up: 5 updates of the model's size plus small framing.
    EXPECT_EQ(r["bytes_down"].get<int64_t>(), 5 * 4 * params);
    EXPECT_GE(r["bytes_up"].get<int64_t>(), 5 * 4 * params);
    EXPECT_LE(r["bytes_up"].get<int64_t>(), 5 * (4 * params + 64));
  }
  // 4 Gaussian classes: chance is 0.25; FedAvg gets most of them right in a few rounds.
  EXPECT_GT(rep["test_accuracy"].get<double>(), 0.8);
  EXPECT_EQ(rep["client_examples"].size(), 10u);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "run" / "model.pt"));
}

TEST_F(SimDir, ResumedRunEqualsTheUninterruptedOne) {
  const nlohmann::json full = run_simulation(job(), SimulationOptions{"", false});
  std::filesystem::remove_all(dir_ / "run");
  core::Config first = job();
  first.set("federated.rounds", "3");
  run_simulation(first, SimulationOptions{"", false});
  core::Config rest = job();
  rest.set("checkpoint.resume", "true");
  const nlohmann::json resumed = run_simulation(rest, SimulationOptions{"", false});
  ASSERT_EQ(resumed["rounds"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed["rounds"][i]["cohort"], full["rounds"][i]["cohort"]) << i;
    EXPECT_DOUBLE_EQ(resumed["rounds"][i]["mean_loss"].get<double>(),
                     full["rounds"][i]["mean_loss"].get<double>())
        << i;
  }
  EXPECT_DOUBLE_EQ(resumed["test_accuracy"].get<double>(), full["test_accuracy"].get<double>());
}

TEST_F(SimDir, SecureAggregationGivesThePlainModel) {
  const nlohmann::json plain = run_simulation(job(), SimulationOptions{"", false});
  std::filesystem::remove_all(dir_ / "run");
  const nlohmann::json secure =
      run_simulation(job("federated.secure_aggregation: true\n"), SimulationOptions{"", false});
  ASSERT_EQ(secure["rounds"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    // Same cohorts; the losses agree to fixed-point precision (1e-7 per coordinate per round).
    EXPECT_EQ(secure["rounds"][i]["counted"], plain["rounds"][i]["counted"]);
    EXPECT_NEAR(secure["rounds"][i]["mean_loss"].get<double>(),
                plain["rounds"][i]["mean_loss"].get<double>(), 1e-4);
    // Masked inputs and key material cost more than the plain update, never less.
    EXPECT_GT(secure["rounds"][i]["bytes_up"].get<int64_t>(),
              plain["rounds"][i]["bytes_up"].get<int64_t>());
  }
  EXPECT_NEAR(secure["test_accuracy"].get<double>(), plain["test_accuracy"].get<double>(), 0.01);
}

TEST_F(SimDir, DropoutsAreReportedAndRoundsStillComplete) {
  const nlohmann::json rep =
      run_simulation(job("federated.sim_dropout: 0.3\nfederated.secure_aggregation: true\n"
                         "federated.secagg_threshold: 0.4\n"),
                     SimulationOptions{"", false});
  int64_t dropped = 0, ok = 0;
  for (const auto& r : rep["rounds"]) {
    dropped += static_cast<int64_t>(r["dropped"].size());
    ok += r["ok"].get<bool>();
    for (const auto& d : r["dropped"])
      EXPECT_NE(d["reason"].get<std::string>().find("simulated dropout"), std::string::npos);
    // Nobody vanishes: each cohort member is counted, or dropped with a reason (a client lost
    // in the last stage is both: its masked input is in the sum).
    if (r["ok"].get<bool>())
      for (const auto& id : r["cohort"]) {
        bool seen = false;
        for (const auto& x : r["counted"]) seen |= x == id;
        for (const auto& d : r["dropped"]) seen |= d["client"] == id;
        EXPECT_TRUE(seen) << id;
      }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_GE(ok, 4);
}

// Credit scoring on a table: regional branches hold rows of (age, income, debt ratio, late
// payments); the label is a fixed rule of those columns, so a model that learns it beats the
// majority class by far.
TEST_F(SimDir, TabularCsvFederationLearnsTheRule) {
  const std::string csv = (dir_ / "credit.csv").string();
  {
    std::ofstream out(csv);
    out << "age,income,debt_ratio,late_payments,default\n";
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> u(0, 1);
    for (int i = 0; i < 3000; ++i) {
      const double age = 20 + 50 * u(rng), income = 15000 * std::exp(1.5 * u(rng));
      const double debt = u(rng);
      const int late = static_cast<int>(4 * u(rng) * u(rng));
      const double score =
          0.03 * (age - 45) - 2.0 * (debt - 0.5) + 0.8 * std::log(income / 40000) - 0.5 * late;
      out << age << "," << income << "," << debt << "," << late << "," << (score < 0 ? 1 : 0)
          << "\n";
    }
  }
  core::Config c = job();
  c.set("data.name", "csv");
  c.set("data.path", csv);
  c.set("data.label_column", "default");
  c.set("data.test_fraction", "0.2");
  c.set("federated.partition", "dirichlet");
  c.set("federated.clients", "8");
  c.set("federated.rounds", "10");
  c.set("train.optimizer.lr", "0.2");
  const nlohmann::json rep = run_simulation(c, SimulationOptions{"", false});
  const data::DataSplits d = train::load_data(c);
  const double majority = std::max(d.test->targets.to(at::kDouble).mean().item<double>(),
                                   1 - d.test->targets.to(at::kDouble).mean().item<double>());
  EXPECT_GT(rep["test_accuracy"].get<double>(), 0.9) << "majority " << majority;
  EXPECT_GT(rep["test_accuracy"].get<double>(), majority + 0.1);
}

TEST_F(SimDir, BadCombinationsNameTheKey) {
  core::Config c = job();
  c.set("federated.min_clients", "11");
  try {
    run_simulation(c, SimulationOptions{"", false});
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("federated.min_clients"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace krab::federated
