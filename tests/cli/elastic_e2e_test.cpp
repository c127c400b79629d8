// End-to-end: `krab train` with elastic.enabled on one machine (docs/design/elastic.md §12,
// items 1 and 2). The test kills a worker with SIGKILL, as a dead machine would, at a step it
// reads from --progress-file, by the PID the launcher wrote to RUN_DIR/workers.json; the run
// must finish every step with exit 0, lose at most the step in flight, leave no process behind,
// and end where the uninterrupted run ends: the global batch is fixed, only its split changes.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/cli_support.h"
#include "elastic/support/etcd_daemon.h"

namespace {

using namespace krab::cli_test;

// 4 workers, an MLP on synthetic data, a global batch of 48 (12 per worker; 16 on three).
const char* kElasticJob = R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 12}
train: {steps: 80, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 4}
comm: {timeout_s: 30}
)";

class Elastic : public Cli {
 protected:
  // The completed steps --progress-file says, or -1 before the first.
  int64_t progress() {
    std::ifstream in((dir_ / "progress").string());
    int64_t done = -1;
    in >> done;
    return in ? done : -1;
  }
  nlohmann::json workers_json(const std::string& run) {
    return nlohmann::json::parse(krab::core::read_file((dir_ / run / "workers.json").string()));
  }
  // Starts the elastic run in the background, kills rank `rank` once `step` steps are done,
  // waits for the launcher; returns its exit status and the killed PID.
  std::pair<int, pid_t> run_and_kill(const std::string& run, int rank, int64_t step,
                                     const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"train",           "job.yaml",
                                  "--report",        run + ".json",
                                  "--progress-file", "progress",
                                  "--set",           "checkpoint.dir=" + run,
                                  "--set",           "elastic.enabled=true"};
    args.insert(args.end(), extra.begin(), extra.end());
    const pid_t launcher = start_krab(dir_, (dir_ / (run + ".log")).string(), args);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (progress() < step && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_GE(progress(), step) << krab::core::read_file((dir_ / (run + ".log")).string());
    pid_t victim = 0;
    const nlohmann::json workers = workers_json(run);
    for (const auto& w : workers["workers"])
      if (w["rank"] == rank) victim = w["pid"].get<pid_t>();
    EXPECT_GT(victim, 0) << workers.dump();
    if (victim > 0) ::kill(victim, SIGKILL);
    int status = 0;
    EXPECT_TRUE(wait_exit(launcher, 120, status));
    std::filesystem::remove(dir_ / "progress");
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, victim};
  }
  void expect_no_process_left(const std::string& run) {
    const nlohmann::json workers = workers_json(run);
    for (const auto& w : workers["workers"]) {
      const pid_t pid = w["pid"].get<pid_t>();
      EXPECT_NE(::kill(pid, 0), 0) << "pid " << pid << " of " << run << " is still alive";
    }
  }
};

// Item 2 (data parallel): rank 2 killed after step 5; the 3 survivors finish all 80 steps, and
// the parameters equal the uninterrupted 4-worker run's within float order (1e-4 relative).
TEST_F(Elastic, AKilledWorkerLeavesTheRunOnTheUninterruptedTrajectory) {
  write("job.yaml", kElasticJob);
  auto whole = run(krab("train job.yaml --set checkpoint.dir=whole"));
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto [code, victim] = run_and_kill("cut", 2, 5);
  const std::string log = krab::core::read_file((dir_ / "cut.log").string());
  ASSERT_EQ(code, 0) << log;
  EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "cut.json").string()));
  EXPECT_EQ(report["steps"], 80);
  ASSERT_TRUE(report.contains("membership")) << report.dump();
  ASSERT_EQ(report["membership"].size(), 1u) << report["membership"].dump();
  const auto& change = report["membership"][0];
  EXPECT_EQ(change["generation"], 1);
  EXPECT_EQ(change["workers"], 3);
  EXPECT_LE(change["lost_steps"].get<int64_t>(), 1);
  EXPECT_GE(change["step"].get<int64_t>(), 5);
  EXPECT_TRUE(change.contains("resumed_at")) << change.dump();
  EXPECT_LT(change["recovery_seconds"].get<double>(), 5.0) << change.dump();
  const double diff = max_rel_diff(load_model_pt((dir_ / "whole" / "model.pt").string()),
                                   load_model_pt((dir_ / "cut" / "model.pt").string()));
  EXPECT_LE(diff, 1e-4);
  expect_no_process_left("cut");
}

// Item 2 with ZeRO stage 3 (parameters, gradients and optimizer state sharded, every shard
// also kept by the next rank): rank 2's shards come back from rank 3, the survivors reshard the
// committed step for three in memory, and the run ends where the uninterrupted stage-3 run
// ends (1e-4 relative).
TEST_F(Elastic, WithZeroStage3TheKilledWorkersShardsComeBackFromTheirBuddies) {
  write("job.yaml", kElasticJob);
  auto whole = run(krab("train job.yaml --set checkpoint.dir=whole --set parallel.zero_stage=3"));
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto [code, victim] = run_and_kill("cut", 2, 5, {"--set", "parallel.zero_stage=3"});
  const std::string log = krab::core::read_file((dir_ / "cut.log").string());
  ASSERT_EQ(code, 0) << log;
  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "cut.json").string()));
  EXPECT_EQ(report["steps"], 80);
  ASSERT_EQ(report["membership"].size(), 1u) << report["membership"].dump();
  EXPECT_EQ(report["membership"][0]["workers"], 3);
  EXPECT_LE(report["membership"][0]["lost_steps"].get<int64_t>(), 1);
  EXPECT_EQ(report["zero"]["stage"], 3) << report.dump();
  const double diff = max_rel_diff(load_model_pt((dir_ / "whole" / "model.pt").string()),
                                   load_model_pt((dir_ / "cut" / "model.pt").string()));
  EXPECT_LE(diff, 1e-4);
  expect_no_process_left("cut");
}

// Item 1, CI's share: three kills of a seeded random rank (rank 0 among them: its successor
// writes the report and model.pt) at a seeded random step; every run completes with exit 0.
TEST_F(Elastic, ARandomWorkerKilledAtARandomStepNeverStopsTheRun) {
  write("job.yaml", kElasticJob);
  std::mt19937 rng(27);
  for (int trial = 0; trial < 3; ++trial) {
    const int rank = trial == 0 ? 0 : static_cast<int>(rng() % 4);
    const int64_t step = 3 + static_cast<int64_t>(rng() % 60);
    const std::string run_name = "trial" + std::to_string(trial);
    SCOPED_TRACE(run_name + ": rank " + std::to_string(rank) + " at step " + std::to_string(step));
    const auto [code, victim] = run_and_kill(run_name, rank, step);
    const std::string log = krab::core::read_file((dir_ / (run_name + ".log")).string());
    ASSERT_EQ(code, 0) << log;
    const auto report =
        nlohmann::json::parse(krab::core::read_file((dir_ / (run_name + ".json")).string()));
    EXPECT_EQ(report["steps"], 80);
    ASSERT_EQ(report["membership"].size(), 1u) << report.dump();
    EXPECT_LE(report["membership"][0]["lost_steps"].get<int64_t>(), 1);
    EXPECT_TRUE(std::filesystem::exists(dir_ / run_name / "model.pt"));
    expect_no_process_left(run_name);
  }
}

// Item 3 on one machine: with elastic.replace_dead the launcher replaces a killed worker with
// a new member that joins at a step boundary and receives the state; then a worker asked to
// leave (SIGTERM to it, not to the launcher) leaves at a step boundary. All three changes are
// in the report (the join and the leave lose no step), and the run still ends on the
// uninterrupted trajectory.
TEST_F(Elastic, AReplacementJoinsAndAWorkerLeavesGracefully) {
  write("job.yaml", std::string(kElasticJob) + "elastic: {replace_dead: true}\n");
  auto whole = run(krab("train job.yaml --set checkpoint.dir=whole --set train.steps=300"));
  ASSERT_EQ(whole.code, 0) << whole.output;
  const pid_t launcher = start_krab(
      dir_, (dir_ / "jl.log").string(),
      {"train", "job.yaml", "--report", "jl.json", "--progress-file", "progress", "--set",
       "checkpoint.dir=jl", "--set", "elastic.enabled=true", "--set", "train.steps=300"});
  const auto log = [&] { return krab::core::read_file((dir_ / "jl.log").string()); };
  const auto wait_until = [&](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  const auto pid_of = [&](int rank) {
    const nlohmann::json workers = workers_json("jl");
    for (const auto& w : workers["workers"])
      if (w["rank"] == rank) return w["pid"].get<pid_t>();
    return pid_t{0};
  };
  ASSERT_TRUE(wait_until([&] { return progress() >= 5; })) << log();
  ::kill(pid_of(1), SIGKILL);
  ASSERT_TRUE(wait_until([&] { return workers_json("jl")["generation"] >= 2; })) << log();
  const int64_t joined_at = progress();
  ASSERT_TRUE(wait_until([&] { return progress() >= joined_at + 5; })) << log();
  const pid_t leaver = pid_of(2);
  ::kill(leaver, SIGTERM);
  int status = 0;
  ASSERT_TRUE(wait_exit(launcher, 120, status)) << log();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log();
  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "jl.json").string()));
  EXPECT_EQ(report["steps"], 300);
  const auto& changes = report["membership"];
  ASSERT_EQ(changes.size(), 3u) << changes.dump() << log();
  EXPECT_EQ(changes[0]["reason"], "death");
  EXPECT_LE(changes[0]["lost_steps"].get<int64_t>(), 1);
  EXPECT_EQ(changes[1]["reason"], "join");
  EXPECT_EQ(changes[1]["joined"], "0.1.1");
  EXPECT_EQ(changes[1]["lost_steps"], 0);
  EXPECT_EQ(changes[1]["workers"], 4);
  EXPECT_EQ(changes[2]["reason"], "leave");
  EXPECT_EQ(changes[2]["lost_steps"], 0) << changes[2].dump();
  EXPECT_EQ(changes[2]["workers"], 3);
  EXPECT_NE(::kill(leaver, 0), 0) << "the leaver is still running";
  const double diff = max_rel_diff(load_model_pt((dir_ / "whole" / "model.pt").string()),
                                   load_model_pt((dir_ / "jl" / "model.pt").string()));
  EXPECT_LE(diff, 1e-4);
  expect_no_process_left("jl");
}

// A frozen worker (SIGSTOP: a hung process or a machine cut off) fails no op; the others
// block in a collective until the keeper, seeing no heartbeat for elastic.dead_after_ms, drops
// it (and kills it), and they go on without it.
TEST_F(Elastic, AFrozenWorkerIsDroppedAfterDeadAfterMs) {
  write("job.yaml", std::string(kElasticJob) + "elastic: {dead_after_ms: 1500}\n");
  const pid_t launcher =
      start_krab(dir_, (dir_ / "frozen.log").string(),
                 {"train", "job.yaml", "--report", "frozen.json", "--progress-file", "progress",
                  "--set", "checkpoint.dir=frozen", "--set", "elastic.enabled=true"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (progress() < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  pid_t frozen = 0;
  const nlohmann::json workers = workers_json("frozen");
  for (const auto& w : workers["workers"])
    if (w["rank"] == 1) frozen = w["pid"].get<pid_t>();
  ASSERT_GT(frozen, 0) << workers.dump();
  ::kill(frozen, SIGSTOP);
  int status = 0;
  const std::string log = [&] {
    EXPECT_TRUE(wait_exit(launcher, 120, status));
    return krab::core::read_file((dir_ / "frozen.log").string());
  }();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "frozen.json").string()));
  EXPECT_EQ(report["steps"], 80);
  ASSERT_EQ(report["membership"].size(), 1u) << report.dump();
  const auto& change = report["membership"][0];
  EXPECT_EQ(change["reason"], "freeze");
  EXPECT_NE(change["lost"].get<std::string>().find("no heartbeat for"), std::string::npos);
  EXPECT_LE(change["lost_steps"].get<int64_t>(), 1);
  EXPECT_NE(::kill(frozen, 0), 0) << "the frozen worker is still there";
  expect_no_process_left("frozen");
}

// Item 7 with the local provider: from 1 worker (max 4) the launcher adds workers while the
// last addition paid and removes the last one when it did not, and settles. Every decision in
// RUN_DIR/autoscale.json must follow from the rates it records (add: no addition measured yet,
// or efficiency >= up; remove: efficiency < down), every change is a join or a leave that lost
// no step, and on a 2-core machine the run cannot settle above 2 workers: a third CNN worker
// only shares the cores. (The final evaluation is no part of it: 500 test images, not 10,000.)
TEST_F(Elastic, AutoscaleFromOneWorkerSettlesWhereTheLastAdditionStillPaid) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 128}
train: {steps: 500, eval_examples: 500, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 1}
elastic: {enabled: true, max_workers: 4,
          autoscale: {provider: local, window_steps: 8, cooldown_steps: 30}}
)");
  auto r = run(krab("train job.yaml --report as.json --set checkpoint.dir=as"), 300);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto scale =
      nlohmann::json::parse(krab::core::read_file((dir_ / "as" / "autoscale.json").string()));
  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "as.json").string()));
  EXPECT_EQ(report["steps"], 500);
  EXPECT_TRUE(scale["settled"].get<bool>()) << scale.dump(1);
  const auto& decisions = scale["decisions"];
  ASSERT_FALSE(decisions.empty()) << scale.dump(1);
  EXPECT_EQ(decisions[0]["action"], "add");  // from 1 worker, nothing measured against
  for (const auto& d : decisions) {
    if (d["action"] == "add") {
      EXPECT_TRUE(!d.contains("efficiency") || d["efficiency"].get<double>() >= 0.6) << d.dump();
      EXPECT_EQ(d["to"].get<int>(), d["from"].get<int>() + 1);
    } else {
      ASSERT_TRUE(d.contains("efficiency")) << d.dump();
      EXPECT_LT(d["efficiency"].get<double>(), 0.3) << d.dump();
      EXPECT_EQ(d["to"].get<int>(), d["from"].get<int>() - 1);
    }
  }
  int workers = 1;
  for (const auto& change : report["membership"]) {
    EXPECT_EQ(change["kind"], "proposal") << change.dump();
    EXPECT_EQ(change["lost_steps"], 0) << change.dump();
    workers = change["workers"].get<int>();
  }
  EXPECT_EQ(workers, scale["workers"].get<int>());
  EXPECT_EQ(report["membership"].size(), decisions.size());
  if (std::thread::hardware_concurrency() == 2) EXPECT_LE(workers, 2) << scale.dump(1);
}

// Below elastic.min_workers for elastic.wait_s (§2.5): the keeper stops the run, the rank 0
// of the survivors writes a checkpoint of the steps it applied, the launcher exits 1 saying
// how to go on, and checkpoint.resume continues from it to the end.
TEST_F(Elastic, BelowMinWorkersTheRunStopsResumably) {
  write("job.yaml", std::string(kElasticJob) + "elastic: {min_workers: 4, wait_s: 1}\n");
  const auto [code, victim] = run_and_kill("low", 3, 10);
  const std::string log = krab::core::read_file((dir_ / "low.log").string());
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("elastic.min_workers 4"), std::string::npos) << log;
  EXPECT_NE(log.find("checkpoint.resume"), std::string::npos) << log;
  bool saved = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "low"))
    saved = saved || entry.path().filename().string().rfind("step-", 0) == 0;
  ASSERT_TRUE(saved) << log;
  auto resumed =
      run(krab("train job.yaml --report resumed.json --set checkpoint.dir=low "
               "--set checkpoint.resume=true"));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  const auto report =
      nlohmann::json::parse(krab::core::read_file((dir_ / "resumed.json").string()));
  EXPECT_GE(report["start_step"].get<int64_t>(), 10);
  EXPECT_EQ(report["steps"], 80);
  expect_no_process_left("low");
}

// Across machines, the c10d rendezvous (§6.1-§6.3), two launchers on loopback: node 0 keeps
// the membership in its TCPStore, node 1 is its agent. Node 1's worker 1.1.0 is killed: its
// launcher reports the exit, so the keeper names it. Then machines ask to join the running run:
// one whose job differs (another learning rate) is refused naming the key, one with another
// secret finds no job, one without a secret is refused before it asks, all with exit 2 and
// the run undisturbed; one with the same job and secret is admitted as node 2 and its worker
// joins at a step boundary. Both changes are in the report, and the run ends on the
// uninterrupted 4-worker trajectory (the global batch is fixed).
TEST_F(Elastic, AcrossTwoMachinesADeathIsReportedAndAMachineJoinsOrIsRefusedByName) {
  // Rank 0 sleeps 60 ms a step (the math is unchanged), so the run outlasts the joins.
  write("job.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 12}
train: {steps: 300, slow_rank: 0, slow_delay_ms: 60, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 4}
comm: {timeout_s: 30}
elastic: {enabled: true}
)");
  write("secret", "0123456789abcdef0123456789abcdef\n");
  write("other", "fedcba9876543210fedcba9876543210\n");
  auto whole =
      run(krab("train job.yaml --set checkpoint.dir=whole --set elastic.enabled=false "
               "--set train.slow_delay_ms=0"));
  ASSERT_EQ(whole.code, 0) << whole.output;
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const auto node = [&](int rank, const std::vector<std::string>& extra) {
    std::vector<std::string> args{
        "train",  "job.yaml", "--nnodes",          "2",     "--node-rank", std::to_string(rank),
        "--rdzv", rdzv,       "--job-secret-file", "secret"};
    args.insert(args.end(), extra.begin(), extra.end());
    return start_krab(dir_, (dir_ / ("n" + std::to_string(rank) + ".log")).string(), args);
  };
  const pid_t n0 =
      node(0, {"--report", "mn.json", "--progress-file", "progress", "--set", "checkpoint.dir=mn"});
  const pid_t n1 = node(1, {});
  const auto log = [&] {
    return krab::core::read_file((dir_ / "n0.log").string()) + "--- node 1:\n" +
           krab::core::read_file((dir_ / "n1.log").string());
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (progress() < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  pid_t victim = 0;  // node 1's second worker, a child of node 1's launcher
  for (pid_t child : children_of(n1))
    if (environ_of(child).find("\nKRAB_MEMBER_ID=1.1.0\n") != std::string::npos) victim = child;
  ASSERT_GT(victim, 0) << log();
  ::kill(victim, SIGKILL);
  while (workers_json("mn")["generation"] < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  const std::string join = "train job.yaml --join " + rdzv;
  expect_refused(run(krab(join + " --job-secret-file secret --set train.optimizer.lr=0.1")), 2,
                 "node 2's job differs from node 0's at key train.optimizer.lr: '0.1' vs '0.05'");
  expect_refused(run(krab(join + " --job-secret-file other")), 2,
                 "no running elastic job there answers to this job secret");
  expect_refused(run("unset KRAB_JOB_SECRET; " + krab(join)), 2,
                 "a machine joins with the running job's secret");
  const Result joined = run(krab(join + " --job-secret-file secret"), 120);
  EXPECT_EQ(joined.code, 0) << joined.output;
  EXPECT_NE(joined.output.find("as node 2 with 1 worker(s)"), std::string::npos) << joined.output;
  int status = 0;
  ASSERT_TRUE(wait_exit(n0, 120, status)) << log();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log();
  ASSERT_TRUE(wait_exit(n1, 30, status)) << log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log();

  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "mn.json").string()));
  EXPECT_EQ(report["steps"], 300);
  const auto& changes = report["membership"];
  ASSERT_EQ(changes.size(), 2u) << changes.dump() << log();
  EXPECT_EQ(changes[0]["reason"], "death");
  EXPECT_EQ(changes[0]["lost"], "member 1.1.0 killed by signal 9") << changes[0].dump();
  EXPECT_EQ(changes[0]["workers"], 3);
  EXPECT_EQ(changes[1]["reason"], "join");
  EXPECT_EQ(changes[1]["joined"], "2.0.0");
  EXPECT_EQ(changes[1]["lost_steps"], 0);
  EXPECT_EQ(changes[1]["workers"], 4);
  const double diff = max_rel_diff(load_model_pt((dir_ / "whole" / "model.pt").string()),
                                   load_model_pt((dir_ / "mn" / "model.pt").string()));
  EXPECT_LE(diff, 1e-4);
}

// Item 5 on loopback (the namespace test is tests/net/elastic_etcd.sh): three launchers of one
// worker each keep the membership in a real etcd; node 0, which started the run and leads,
// is SIGKILLed (its worker dies with it). Once node 0's lease (elastic.lease_s 2) is gone,
// another machine wins the election, hosts the groups' store and publishes generation 1
// without member 0.0.0; the two survivors finish with exit 0, the last rank 0 writes the
// report and model.pt on its machine, on the uninterrupted 3-worker trajectory.
TEST_F(Elastic, WithEtcdTheMachineThatStartedTheRunDiesAndAnotherTakesTheMembershipOver) {
  std::string skip;
  const auto etcd = krab::test::EtcdDaemon::start(1, &skip);
  if (!etcd) GTEST_SKIP() << skip;
  write("job.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 12}
train: {steps: 200, slow_rank: 0, slow_delay_ms: 30, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 3}
comm: {timeout_s: 30}
elastic: {enabled: true, lease_s: 2}
)");
  write("secret", "0123456789abcdef0123456789abcdef\n");
  auto whole =
      run(krab("train job.yaml --set checkpoint.dir=whole --set elastic.enabled=false "
               "--set train.slow_delay_ms=0"));
  ASSERT_EQ(whole.code, 0) << whole.output;
  std::vector<pid_t> nodes;
  for (int n = 0; n < 3; ++n) {
    const std::string i = std::to_string(n);
    nodes.push_back(
        start_krab(dir_, (dir_ / ("e" + i + ".log")).string(),
                   {"train", "job.yaml", "--nnodes", "3", "--node-rank", i, "--rdzv-backend",
                    "etcd", "--rdzv-endpoints", etcd->endpoints(), "--job-secret-file", "secret",
                    "--report", "e" + i + ".json", "--progress-file",
                    n == 0 ? "progress" : "progress" + i, "--set", "checkpoint.dir=e" + i}));
  }
  const auto log = [&] {
    std::string all;
    for (int n = 0; n < 3; ++n)
      all += "--- node " + std::to_string(n) + ":\n" +
             krab::core::read_file((dir_ / ("e" + std::to_string(n) + ".log")).string());
    return all;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (progress() < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(progress(), 10) << log();
  ::kill(nodes[0], SIGKILL);
  int status = 0;
  ASSERT_TRUE(wait_exit(nodes[0], 10, status));
  for (int n = 1; n < 3; ++n) {
    ASSERT_TRUE(wait_exit(nodes[n], 120, status)) << log();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "node " << n << "\n" << log();
  }
  EXPECT_NE(log().find("leads the membership from generation 1 on"), std::string::npos) << log();
  const int last = fs::exists(dir_ / "e1" / "model.pt") ? 1 : 2;  // where rank 0 ended
  ASSERT_TRUE(fs::exists(dir_ / ("e" + std::to_string(last)) / "model.pt")) << log();
  const auto report = nlohmann::json::parse(
      krab::core::read_file((dir_ / ("e" + std::to_string(last) + ".json")).string()));
  EXPECT_EQ(report["steps"], 200);
  ASSERT_EQ(report["membership"].size(), 1u) << report["membership"].dump();
  EXPECT_EQ(report["membership"][0]["lost"], "member 0.0.0 lease of node 0 expired");
  EXPECT_EQ(report["membership"][0]["workers"], 2);
  const double diff =
      max_rel_diff(load_model_pt((dir_ / "whole" / "model.pt").string()),
                   load_model_pt((dir_ / ("e" + std::to_string(last)) / "model.pt").string()));
  EXPECT_LE(diff, 1e-4);
}

}  // namespace
