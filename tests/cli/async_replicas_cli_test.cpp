// sync.replicas: 1 end to end (docs/design/elastic.md §9): a parameter server killed with
// SIGKILL in the middle of a run of 2 servers x 3 workers. Its shard's mirror on the other
// server takes over; the run completes with exit 0, and with max_staleness 0 every round is
// applied exactly once, so the model equals the one of the same job run undisturbed. The two
// runs may sum a round's three gradients in different orders (whoever arrives first), which
// is float rounding: the bound is the one the sync-vs-async test uses for the same job size.
#include <signal.h>

#include <regex>

#include "cli_support.h"

namespace {

using namespace krab::cli_test;

// Slow rank 2 (and max_staleness 0: everyone waits for it) makes the 20 steps last seconds, so
// the kill lands mid-run; the progress bar's lines say how far it got.
const char* kMirroredJob = R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 2048, batch_size: 32}
train: {steps: 20, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}, slow_rank: 2,
        slow_delay_ms: 150}
parallel: {workers: 3}
sync: {mode: async, servers: 2, replicas: 1, max_staleness: 0}
comm: {timeout_s: 20}
)";

// The highest step the chief's progress lines in `log` report (-1 before the first).
int64_t steps_shown(const std::string& log) {
  const std::string text = krab::core::read_file(log);
  static const std::regex count(R"((\d+)/20\b)");
  int64_t best = -1;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), count);
       it != std::sregex_iterator(); ++it)
    best = std::max<int64_t>(best, std::stoll((*it)[1]));
  return best;
}

TEST_F(Cli, AsyncReplicasSurviveAKilledParameterServer) {
  write("job.yaml", kMirroredJob);
  const auto calm = run(krab("train job.yaml --report calm.json --set checkpoint.dir=calm"), 180);
  ASSERT_EQ(calm.code, 0) << calm.output;

  const std::string log = (dir_ / "log.txt").string();
  pid_t launcher = start_krab(
      dir_, log, {"train", "job.yaml", "--report", "hit.json", "--set", "checkpoint.dir=hit"});
  // Server 1 is found, then killed once the chief shows a step done: both servers have
  // published their addresses and the workers are training.
  pid_t victim = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline) {
    if (victim < 0)
      for (pid_t k : children_of(launcher))
        if (environ_of(k).find("\nKRAB_PS_SHARD=1\n") != std::string::npos) victim = k;
    if (victim > 0 && steps_shown(log) >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(victim, 0) << "parameter server 1 was not found";
  const int64_t at_kill = steps_shown(log);
  ASSERT_GE(at_kill, 2) << krab::core::read_file(log);
  ASSERT_LT(at_kill, 20) << "the run ended before the kill";
  ::kill(victim, SIGKILL);

  int status = 0;
  if (!wait_exit(launcher, 120, status)) FAIL() << "launcher did not finish after the kill";
  const std::string text = krab::core::read_file(log);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("parameter server 1 was killed by signal 9"), std::string::npos) << text;
  EXPECT_NE(text.find("its shard's mirror goes on for it"), std::string::npos) << text;

  const auto rep = nlohmann::json::parse(krab::core::read_file((dir_ / "hit.json").string()));
  const auto ref = nlohmann::json::parse(krab::core::read_file((dir_ / "calm.json").string()));
  EXPECT_EQ(rep["async"]["replicas"], 1);
  EXPECT_EQ(rep["async"]["failovers"], 1) << rep["async"].dump();  // shard 1, from its mirror
  EXPECT_EQ(ref["async"]["failovers"], 0) << ref["async"].dump();
  EXPECT_EQ(rep["async"]["workers_lost"], 0) << rep["async"].dump();
  EXPECT_EQ(rep["async"]["updates"], 20);  // shard 0: every round applied once
  EXPECT_EQ(rep["async"]["pushes"], 3 * 20);
  const double diff = max_rel_diff(load_model_pt((dir_ / "calm/model.pt").string()),
                                   load_model_pt((dir_ / "hit/model.pt").string()));
  EXPECT_LE(diff, 1e-5) << "killed at step " << at_kill;
  std::printf("killed server 1 at step %lld of 20; max relative difference %.3g\n",
              static_cast<long long>(at_kill), diff);
}

}  // namespace
