// End-to-end: what krab refuses, and how it says so, before any training starts (issue 16):
// outputs that cannot be written, more workers than memory, nodes that disagree about the job,
// rendezvous that times out, and inputs whose old messages were misleading.
#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "core/errors.h"

namespace {

using namespace krab::cli_test;
using krab::str_cat;

// Refused with `code` in well under `seconds`: the check ran before training.
void expect_refused_fast(const std::string& cmd, int code, const std::string& needle,
                         int seconds = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run(cmd, seconds + 30);
  expect_refused(r, code, needle);
  EXPECT_EQ(r.output.find("train ["), std::string::npos) << "it trained first:\n" << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(seconds)) << cmd;
}

TEST_F(Cli, UnwritableOutputsAreRefusedBeforeTraining) {
  write("ok.yaml", kSmallJob);
  expect_refused_fast(krab("train ok.yaml --set checkpoint.dir=/proc/krab/runs"), 2,
                      "checkpoint.dir: cannot write to '/proc/krab/runs'");
  fs::create_directories(dir_ / "out");
  expect_refused_fast(krab("train ok.yaml --report out"), 2, "--report: 'out' is a directory");
  expect_refused_fast(krab("train ok.yaml --report /proc/krab.json"), 2, "--report");
  expect_refused_fast(krab("fl-sim ok.yaml --report out"), 2, "--report: 'out' is a directory");
  expect_refused_fast(krab("fl-server ok.yaml --report /proc/krab.json"), 2, "--report");
  // The check leaves nothing behind: the run directory is created by training, not by it.
  expect_refused_fast(krab("train ok.yaml --set checkpoint.dir=new/runs --report out"), 2,
                      "--report");
  EXPECT_FALSE(fs::exists(dir_ / "new"));
}

// A job named after a file whose name is not UTF-8 (Latin-1 "é" is the byte 0xE9): the report
// is written with the byte replaced, not lost to nlohmann's type_error.316 after training.
TEST_F(Cli, NonUtf8JobNameIsWrittenEscapedInTheReport) {
  write("caf\xE9.yaml", kSmallJob);
  const Result r = run(krab("train 'caf\xE9.yaml' --set train.steps=3 --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(krab::core::read_file((dir_ / "r.json").string()));
  EXPECT_EQ(j["config"]["name"], "caf\xEF\xBF\xBD");  // U+FFFD
}

TEST_F(Cli, MoreWorkersThanMemoryAreRefusedFast) {
  write("big.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 200000, batch_size: 1}
train: {steps: 5}
parallel: {workers: 100000}
)");
  expect_refused_fast(krab("train big.yaml"), 2, "parallel.workers: 100000 worker processes", 30);
  const Result r = run(krab("train big.yaml"));
  EXPECT_NE(r.output.find("MemAvailable"), std::string::npos) << r.output;
  expect_refused_fast(krab("train big.yaml --nproc-per-node 100000"), 2,
                      "--nproc-per-node: 100000 worker processes", 30);
}

constexpr const char* kGptJob = R"(
model: {name: gpt, layers: 2, width: 32, heads: 2, context: 16}
data: {name: text, path: corpus.txt, batch_size: 4}
train: {steps: 3, optimizer: {name: adam, lr: 0.001}}
parallel: {workers: 2}
comm: {timeout_s: 20}
)";

std::string corpus() {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the cat sat on a mat. ";
  return text;
}

// A GPT of 38.7 B parameters (width 8192, 48 blocks) is refused from its configuration alone:
// the launcher predicts its bytes per worker without building it (16 bytes a parameter with Adam
// would take 620 GB), so the refusal comes in well under a second, names the numbers and says
// that even stage 3 with activation checkpointing does not fit. The same job at its small size
// trains.
TEST_F(Cli, AGptTooLargeForTheNodeIsRefusedWithoutBeingBuilt) {
  write("corpus.txt", corpus());
  write("gpt.yaml", kGptJob);
  const std::string huge =
      krab("train gpt.yaml --set model.width=8192 --set model.layers=48 --set model.heads=64");
  expect_refused_fast(huge, 2,
                      "parallel.zero_stage 0: a gpt of 38.7 B parameters needs about 761 GiB "
                      "per worker (parallel.workers 2: 144 GiB params, 144 GiB grads, 288 GiB "
                      "optimizer, 144 GiB working set",
                      5);
  const Result r = run(huge);
  EXPECT_NE(r.output.find("but each has "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("it does not fit even at parallel.zero_stage: 3 and "
                          "model.activation_checkpointing: true"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
  const Result small = run(krab("train gpt.yaml"), 120);
  EXPECT_EQ(small.code, 0) << small.output;
}

// The launcher's cgroup limit is the workers' budget when it is below MemAvailable: krab runs
// in a cgroup v1 memory group capped at 1 GiB, and a GPT of 101 M parameters (2.2 GiB per
// worker at stage 0, which the machine's MemAvailable would hold) is refused naming the
// group's limit file, less what the launcher itself holds. Needs root and cgroup v1's memory
// hierarchy writable; skipped otherwise.
TEST_F(Cli, TheCgroupLimitIsTheWorkersBudget) {
  const fs::path group =
      fs::path("/sys/fs/cgroup/memory") / ("krab_cli_test_" + std::to_string(::getpid()));
  std::error_code ec;
  if (!fs::create_directory(group, ec))
    GTEST_SKIP() << "cannot create " << group << ": " << ec.message();
  struct Remove {
    fs::path p;
    ~Remove() {
      std::error_code ignored;
      fs::remove(p, ignored);  // rmdir: the group is empty once krab has exited
    }
  } remove{group};
  const std::string limit = (group / "memory.limit_in_bytes").string();
  { std::ofstream(limit) << (int64_t{1} << 30); }
  if (krab::core::read_file(limit).rfind("1073741824", 0) != 0) GTEST_SKIP() << "no limit set";
  write("corpus.txt", corpus());
  write("gpt.yaml", kGptJob);
  const std::string tasks = (group / "tasks").string();
  const Result r = run("echo $$ > " + tasks + " && " +
                       krab("train gpt.yaml --set model.width=1024 --set model.layers=8"));
  expect_refused(r, 2, "a gpt of 101.3 M parameters needs about 2.3 GiB per worker");
  // The launcher stays in the group while its workers run: its own resident bytes come off.
  EXPECT_NE(r.output.find("(the cgroup limit in " + limit + ", 1.0 GiB less "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" MiB for the launcher itself, leaves "), std::string::npos) << r.output;
}

TEST_F(Cli, MoreWorkersThanCoresGetAWarning) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cores = CPU_COUNT(&set);
  if (cores > 4) GTEST_SKIP() << cores << " cores: too many workers to start for this test";
  write("ok.yaml", kSmallJob);
  const Result r =
      run(krab(str_cat("train ok.yaml --set train.steps=2 --set parallel.workers=", cores + 1)));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(str_cat("warning: parallel.workers: ", cores + 1, " worker processes on ",
                                  cores, " cores")),
            std::string::npos)
      << r.output;
}

// SIGTERM as soon as the first worker appears (while the launcher is still spawning or the
// workers are still loading): the launcher exits within seconds and takes every worker along.
TEST_F(Cli, SigtermWhileSpawningLeavesNoProcessBehind) {
  write("job.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 8}
train: {steps: 100000}
parallel: {workers: 6}
)");
  const std::string log = (dir_ / "log.txt").string();
  const pid_t launcher = start_krab(dir_, log, {"train", "job.yaml"});
  std::vector<pid_t> seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (seen.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    seen = children_of(launcher);
  }
  ASSERT_FALSE(seen.empty()) << krab::core::read_file(log);
  ::kill(launcher, SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  for (pid_t c : children_of(launcher)) seen.push_back(c);
  int status = 0;
  ASSERT_TRUE(wait_exit(launcher, 10, status)) << "launcher still running after SIGTERM";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(6));
  // The shell's code for a process stopped by SIGTERM, 128 + 15 (SIGINT's would be 130).
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143) << "status " << status;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // orphans' deaths to land
  for (pid_t c : seen) EXPECT_NE(::kill(c, 0), 0) << "process " << c << " survived";
  EXPECT_NE(krab::core::read_file(log).find("interrupted"), std::string::npos)
      << krab::core::read_file(log);
}

TEST_F(Cli, ZeroCountsAreRefusedWithAShortMessage) {
  write("ok.yaml", kSmallJob);
  expect_refused_fast(krab("train ok.yaml --nproc-per-node 0"), 2, "--nproc-per-node");
  const Result r = run(krab("fl-sim ok.yaml --clients 0"));
  expect_refused(r, 2, "--clients: must be a whole number >= 1, got '0'");
  EXPECT_LT(r.output.size(), 200u) << r.output;  // no 309-digit bound
}

TEST_F(Cli, OneStepRunSaysSamplesPerSecIsNotMeasured) {
  write("ok.yaml", kSmallJob);
  const Result r = run(krab("train ok.yaml --set train.steps=1 --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("samples/s not measured"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(krab::core::read_file((dir_ / "r.json").string()));
  EXPECT_TRUE(j["samples_per_sec"].is_null());
  EXPECT_TRUE(j["samples_per_sec_note"].is_string());
}

// Two nodes on loopback, each `krab train --nnodes 2 --node-rank R`: a different job on
// node 1 fails both nodes at rendezvous, before training, naming the first differing key.
TEST_F(Cli, NodesWithDifferentJobsFailAtRendezvous) {
  write("job.yaml", kSmallJob);
  const std::string rdzv = str_cat("127.0.0.1:", free_port());
  const std::string common =
      "--nnodes 2 --nproc-per-node 1 --rdzv " + rdzv + " --set comm.timeout_s=30 ";
  const std::string log0 = (dir_ / "node0.txt").string();
  const pid_t node0 =
      start_krab(dir_, log0,
                 {"train", "job.yaml", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                  "--rdzv", rdzv, "--set", "comm.timeout_s=30", "--set", "train.steps=30"});
  const Result node1 = run(krab("train job.yaml --node-rank 1 " + common +
                                "--set train.steps=20 --set train.optimizer.lr=0.5"));
  int status = 0;
  ASSERT_TRUE(wait_exit(node0, 60, status));
  const std::string want = "node 1's job differs from node 0's at key train.steps: '20' vs '30'";
  expect_refused(node1, 2, want);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << krab::core::read_file(log0);
  EXPECT_NE(krab::core::read_file(log0).find(want), std::string::npos)
      << krab::core::read_file(log0);
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

// The same job on both nodes trains; node 1 says where node 0 put the model and the report,
// and that its own --report is not written.
TEST_F(Cli, NodeOneSaysWhereNodeZeroWroteTheReport) {
  write("job.yaml", kSmallJob);
  const std::string rdzv = str_cat("127.0.0.1:", free_port());
  const std::string log0 = (dir_ / "node0.txt").string();
  const pid_t node0 = start_krab(dir_, log0,
                                 {"train", "job.yaml", "--nnodes", "2", "--node-rank", "0",
                                  "--nproc-per-node", "1", "--rdzv", rdzv, "--report", "r0.json"});
  const Result node1 =
      run(krab("train job.yaml --nnodes 2 --node-rank 1 --nproc-per-node 1 "
               "--rdzv " +
               rdzv + " --report r1.json"));
  int status = 0;
  ASSERT_TRUE(wait_exit(node0, 120, status));
  ASSERT_EQ(node1.code, 0) << node1.output;
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << krab::core::read_file(log0);
  EXPECT_NE(node1.output.find("report on node 0: " + (dir_ / "r0.json").string()),
            std::string::npos)
      << node1.output;
  EXPECT_NE(node1.output.find("--report r1.json is not written on this node"), std::string::npos)
      << node1.output;
  EXPECT_NE(node1.output.find((dir_ / "runs/job/model.pt").string()), std::string::npos)
      << node1.output;
  EXPECT_TRUE(fs::exists(dir_ / "r0.json"));
  EXPECT_FALSE(fs::exists(dir_ / "r1.json"));
}

// A node alone at the rendezvous: one line naming the address and comm.timeout_s, exit 1, no
// C++ backtrace ("Exception raised from recvBytes ... frame #0").
TEST_F(Cli, RendezvousTimeoutIsOneLineNamingAddressAndKey) {
  write("job.yaml", kSmallJob);
  const std::string port = std::to_string(free_port());
  const std::string flags =
      " --nproc-per-node 1 --rdzv 127.0.0.1:" + port + " --set comm.timeout_s=2";
  for (const std::string& cmd :
       {krab("train job.yaml --nnodes 2 --node-rank 0" + flags),
        krab("train job.yaml --nnodes 2 --node-rank 1" + flags),
        "cd " + dir_.string() + " && RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
            port + " " + kKrab + " train job.yaml --set comm.timeout_s=2"}) {
    const Result r = run(cmd, 60);
    expect_refused(r, 1, "127.0.0.1:" + port);
    EXPECT_NE(r.output.find("comm.timeout_s"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("Exception raised"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("InitGoogleLogging"), std::string::npos) << r.output;  // glog's
  }
}

// Under torchrun's variables there is no krab launcher to compare the jobs: two workers that
// disagree (20 and 30 steps) break inside Gloo. Each must still end with one line naming its
// rank and exit 1, not "terminate called after throwing 'gloo::EnforceNotMet'" and SIGABRT.
TEST_F(Cli, GlooFailureInAWorkerIsOneLineAndExitOne) {
  write("job.yaml", kSmallJob);
  const std::string env =
      "cd " + dir_.string() +
      " && WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " ";
  const std::string log0 = (dir_ / "rank0.txt").string();
  const pid_t rank0 = ::fork();
  if (rank0 == 0) {
    const Result r =
        run(env + "RANK=0 " + kKrab + " train job.yaml --set train.steps=30 > " + log0 + " 2>&1");
    ::_exit(r.code);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const Result rank1 = run(env + "RANK=1 " + kKrab + " train job.yaml --set train.steps=20", 120);
  int status = 0;
  ASSERT_TRUE(wait_exit(rank0, 120, status));
  expect_refused(rank1, 1, "krab[rank 1]: error: ");
  const std::string out0 = krab::core::read_file(log0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out0;
  EXPECT_NE(out0.find("krab[rank 0]: error: "), std::string::npos) << out0;
  EXPECT_EQ(out0.find("terminate called"), std::string::npos) << out0;
}

TEST_F(Cli, OutOfRangePortsAreRefused) {
  write("ok.yaml", kSmallJob);
  expect_refused_fast(krab("train ok.yaml --rdzv 127.0.0.1:99999"), 2, "--rdzv: port '99999'");
  expect_refused_fast("cd " + dir_.string() + " && RANK=0 WORLD_SIZE=1 MASTER_PORT=70000 " + kKrab +
                          " train ok.yaml",
                      2, "'70000'");
}

// monitor.bind to an address this machine does not have (TEST-NET-1, RFC 5737: binding fails
// locally, nothing is sent): refused before anything starts, naming the key; no run directory.
TEST_F(Cli, AMonitoringAddressTheMachineDoesNotHaveIsRefused) {
  write("ok.yaml", kSmallJob);
  expect_refused_fast(krab("train ok.yaml --set monitor.port=" + std::to_string(free_port()) +
                           " --set monitor.bind=192.0.2.1"),
                      2, "monitor.bind 192.0.2.1: not an address of this machine");
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

TEST_F(Cli, MisleadingMessagesSayWhatIsWrong) {
  write("ok.yaml", kSmallJob);
  // Relative paths named as krab resolved them (from --set: the current directory).
  expect_refused_fast(krab("train ok.yaml --set data.name=fashion-mnist --set data.path=ok.yaml"),
                      2, "'" + (dir_ / "ok.yaml").string() + "' is a file, not a directory");
  expect_refused_fast(krab("train ok.yaml --set data.name=csv --set data.path=."), 2,
                      "CSV file '" + dir_.string() + "' is a directory");
  expect_refused_fast(krab("trian ok.yaml"), 2, "unknown command 'trian'; did you mean 'train'?");
  expect_refused_fast(krab("privacy epsilonn --delta 1e-5"), 2,
                      "unknown command 'epsilonn'; did you mean 'epsilon'?");
  expect_refused_fast(krab("zzz"), 2, "unknown command 'zzz' (commands: train, fl-sim");
  write("tab.yaml", "model:\n\tname: mlp\n");
  expect_refused_fast(krab("train tab.yaml"), 2, "tab.yaml:2:1: a tab in the indentation");
}

// What spreadsheets write: a UTF-8 byte order mark and quoted fields.
TEST_F(Cli, CsvWithByteOrderMarkAndQuotedNumbersLoads) {
  std::string csv = "\xEF\xBB\xBF\"label\",\"x1\",x2\n";
  for (int i = 0; i < 64; ++i)
    csv += str_cat("\"", i % 2, "\",\"", i * 0.5, "\",", i % 2 ? 1.5 : -1.5, "\r\n");
  write("t.csv", csv);
  write("ok.yaml", kSmallJob);
  const Result r =
      run(krab("train ok.yaml --set data.name=csv --set data.path=t.csv "
               "--set data.label_column=label --set data.batch_size=8 "
               "--set train.steps=2"));
  EXPECT_EQ(r.code, 0) << r.output;
}

}  // namespace
