// End-to-end: the krab binary, its exit codes, its files, and the determinism contract.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/cli_support.h"
#include "comm/store.h"
#include "core/fs.h"

namespace {

using namespace krab::cli_test;

// The determinism contract, the engine's strongest test: W workers with per-worker batch b
// end where one worker with batch W*b ends, up to float reduction order. (Parameters are
// compared, not accuracy: train.eval_examples 500 evaluates 500 test images of 10,000, some 3 s
// of CPU less a run. The other CNN jobs of these tests do the same.)
TEST_F(Cli, FourWorkersMatchOneWorkerOnTheCnn) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 10, eval_examples: 500, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 4, bucket_mb: 0.5}
)");
  auto multi = run(krab("train job.yaml --set checkpoint.dir=w4"));
  ASSERT_EQ(multi.code, 0) << multi.output;
  auto single =
      run(krab("train job.yaml --set checkpoint.dir=w1 --set parallel.workers=1 "
               "--set data.batch_size=64"));
  ASSERT_EQ(single.code, 0) << single.output;
  auto a = load_model_pt((dir_ / "w4/model.pt").string());
  auto b = load_model_pt((dir_ / "w1/model.pt").string());
  ASSERT_TRUE(a.count("conv1.weight"));
  EXPECT_LE(max_rel_diff(a, b), 1e-5);
  // And training moved the parameters at all (the comparison is not vacuous).
  auto c =
      run(krab("train job.yaml --set checkpoint.dir=w0 --set parallel.workers=1 "
               "--set data.batch_size=64 --set train.optimizer.lr=0"));
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_GT(max_rel_diff(a, load_model_pt((dir_ / "w0/model.pt").string())), 1e-3);
}

// Two accumulated micro-batches of 32 are one batch of 64: same examples, loss averaged.
TEST_F(Cli, GradientAccumulationMatchesTheLargerBatch) {
  write("job.yaml", kSmallJob);
  auto accum =
      run(krab("train job.yaml --set checkpoint.dir=a --set train.grad_accum=2 "
               "--set parallel.workers=1"));
  ASSERT_EQ(accum.code, 0) << accum.output;
  auto big =
      run(krab("train job.yaml --set checkpoint.dir=b --set data.batch_size=64 "
               "--set parallel.workers=1"));
  ASSERT_EQ(big.code, 0) << big.output;
  EXPECT_LE(max_rel_diff(load_model_pt((dir_ / "a/model.pt").string()),
                         load_model_pt((dir_ / "b/model.pt").string())),
            1e-5);
}

TEST_F(Cli, ResumeEndsWhereAnUninterruptedRunEnds) {
  write("job.yaml", kSmallJob);
  auto full = run(krab("train job.yaml --set checkpoint.dir=full"));
  ASSERT_EQ(full.code, 0) << full.output;
  auto first = run(krab("train job.yaml --set checkpoint.dir=part --set train.steps=10"));
  ASSERT_EQ(first.code, 0) << first.output;
  auto second = run(krab("train job.yaml --set checkpoint.dir=part --set checkpoint.resume=true"));
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  auto a = load_model_pt((dir_ / "full/model.pt").string());
  auto b = load_model_pt((dir_ / "part/model.pt").string());
  EXPECT_EQ(max_rel_diff(a, b), 0.0);
}

TEST_F(Cli, ReportHasTheDocumentedFieldsAndTrafficMatchesTheRing) {
  write("job.yaml", kSmallJob);
  auto r = run(krab("train job.yaml --report report.json --set parallel.workers=3"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(krab::core::read_file((dir_ / "report.json").string()));
  for (const char* k : {"workers", "global_batch", "steps", "epochs", "samples_per_sec",
                        "wall_seconds", "final_loss", "test_accuracy", "bytes_sent", "checkpoint"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["workers"], 3);
  EXPECT_EQ(j["global_batch"], 96);
  // Ring all-reduce: each of W ranks sends 2(W-1)/W of the gradient per step.
  const double grad = j["gradient_bytes"].get<double>();
  const double per_step = j["bytes_sent_by_op"]["allreduce"].get<double>() / 20;
  EXPECT_NEAR(per_step / (2.0 * 2 / 3 * grad * 3), 1.0, 0.05);
  EXPECT_TRUE(fs::exists(dir_ / j["checkpoint"].get<std::string>()));
}

TEST_F(Cli, ModelPtIsReadableByPythonTorch) {
  write("job.yaml", kSmallJob);
  ASSERT_EQ(run(krab("train job.yaml --set train.steps=2")).code, 0);
  auto py = run(std::string(KRAB_PYTHON) + " -c \"import torch; d=torch.load('" +
                (dir_ / "runs/job/model.pt").string() +
                "'); print(sorted(d.keys())[0], tuple(d['fc1.weight'].shape))\"");
  ASSERT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("fc1.bias (32, 32)"), std::string::npos) << py.output;
}

// Under another launcher krab is one worker: the same job started as two processes with
// torchrun's variables (and again with Slurm's) ends where krab's own launcher ends.
TEST_F(Cli, TorchrunAndSlurmEnvironmentsMatchTheOwnLauncher) {
  write("job.yaml", kSmallJob);
  auto own = run(krab("train job.yaml --set checkpoint.dir=own"));
  ASSERT_EQ(own.code, 0) << own.output;
  // Two workers started side by side, rank 0 in the background; both must exit 0.
  auto pair = [&](const std::string& env, const std::string& rank_var, const std::string& out) {
    const std::string job = " train job.yaml --set checkpoint.dir=" + out;
    return run("cd " + dir_.string() + " && (" + env + " " + rank_var + "=0 " + kKrab + job +
               " & " + env + " " + rank_var + "=1 " + kKrab + job +
               "-rank1; r1=$?; wait $!; "
               "r0=$?; test $r0 -eq 0 -a $r1 -eq 0)");
  };
  const auto own_model = load_model_pt((dir_ / "own/model.pt").string());
  auto tr =
      pair("MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " WORLD_SIZE=2",
           "RANK", "tr");
  ASSERT_EQ(tr.code, 0) << tr.output;
  EXPECT_EQ(max_rel_diff(own_model, load_model_pt((dir_ / "tr/model.pt").string())), 0.0);
  auto sl =
      pair("MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " SLURM_NTASKS=2",
           "SLURM_PROCID", "sl");
  ASSERT_EQ(sl.code, 0) << sl.output;
  EXPECT_EQ(max_rel_diff(own_model, load_model_pt((dir_ / "sl/model.pt").string())), 0.0);
}

#ifdef KRAB_MPIEXEC
// comm.backend mpi under mpirun trains the same model as gloo under krab's launcher (up to
// float reduction order: the two libraries sum in different orders).
TEST_F(Cli, MpiBackendUnderMpirunMatchesGloo) {
  write("job.yaml", kSmallJob);
  auto gloo = run(krab("train job.yaml --set checkpoint.dir=gloo"));
  ASSERT_EQ(gloo.code, 0) << gloo.output;
  auto mpi = run("cd " + dir_.string() + " && " + KRAB_MPIEXEC +
                 " --allow-run-as-root --oversubscribe -np 2 " + kKrab +
                 " train job.yaml --set comm.backend=mpi --set checkpoint.dir=mpi");
  ASSERT_EQ(mpi.code, 0) << mpi.output;
  EXPECT_LE(max_rel_diff(load_model_pt((dir_ / "gloo/model.pt").string()),
                         load_model_pt((dir_ / "mpi/model.pt").string())),
            1e-5);
  // Started without mpirun, the mpi backend is refused with the way to start it.
  expect_refused(run(krab("train job.yaml --set comm.backend=mpi")), 2, "mpirun");
}
#endif

// ---- bad input: exit 2, one line naming the cause, nothing left behind ----

TEST_F(Cli, BadInputIsRefusedWithExitTwo) {
  write("bad.yaml", "model: {name: cnn\n  data: [");
  expect_refused(run(krab("train bad.yaml --report r.json")), 2, "bad.yaml:");
  write("unknown.yaml", "train: {epoch: 2}\n");
  expect_refused(run(krab("train unknown.yaml")), 2, "did you mean 'train.epochs'");
  write("type.yaml", "train: {steps: many}\n");
  expect_refused(run(krab("train type.yaml")), 2, "train.steps");
  write("ok.yaml", kSmallJob);
  expect_refused(run(krab("train ok.yaml --set parallel.workers=0")), 2, "parallel.workers");
  expect_refused(run(krab("train ok.yaml --set parallel.workers=-1")), 2, "parallel.workers");
  expect_refused(run(krab("train ok.yaml --set data.batch_size=4000")), 2,
                 "larger than the training data");
  expect_refused(run(krab("train ok.yaml --set data.name=fashion-mnist --set data.path=nope")), 2,
                 "nope");
  expect_refused(run(krab("train missing.yaml")), 2, "missing.yaml");
  expect_refused(run(krab("train ok.yaml --bogus")), 2, "bogus");
  EXPECT_FALSE(fs::exists(dir_ / "r.json"));
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

TEST_F(Cli, BadCompressionSettingsAreRefusedWithExitTwo) {
  write("ok.yaml", kSmallJob);
  expect_refused(run(krab("train ok.yaml --set comm.compression=zip")), 2, "comm.compression");
  expect_refused(run(krab("train ok.yaml --set comm.compression=topk --set comm.ratio=0")), 2,
                 "comm.ratio");
  expect_refused(run(krab("train ok.yaml --set comm.compression=topk --set comm.ratio=1.5")), 2,
                 "comm.ratio");
  expect_refused(run(krab("train ok.yaml --set comm.compression=powersgd --set comm.rank=0")), 2,
                 "comm.rank");
  expect_refused(run(krab("train ok.yaml --set comm.compression=topk "
                          "--set comm.momentum_correction=0.9")),
                 2, "train.optimizer.momentum");
  // onebit's default rotation needs a power-of-2 chunk; naming it with int8 is refused.
  expect_refused(run(krab("train ok.yaml --set comm.compression=onebit --set comm.chunk=96")), 2,
                 "comm.chunk");
  expect_refused(
      run(krab("train ok.yaml --set comm.compression=int8 --set comm.rotation=hadamard")), 2,
      "comm.rotation");
  // Folding sgd's momentum is for randomk, whose error feedback is momentum.
  expect_refused(
      run(krab("train ok.yaml --set comm.compression=topk --set comm.fold_momentum=true")), 2,
      "comm.fold_momentum");
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

// Compressed training end to end: the report's meter shows the traffic the codec promises, and
// the run still learns (its loss ends below the first steps' loss, like the plain run's).
TEST_F(Cli, CompressedTrainingSendsLessAndLearns) {
  write("job.yaml", kSmallJob);
  const std::string common = " --set comm.compress_min_numel=0 --set train.steps=30";
  ASSERT_EQ(run(krab("train job.yaml --report plain.json" + common)).code, 0);
  auto r = run(krab("train job.yaml --report int8.json --set comm.compression=int8" + common));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto plain = nlohmann::json::parse(krab::core::read_file((dir_ / "plain.json").string()));
  const auto int8 = nlohmann::json::parse(krab::core::read_file((dir_ / "int8.json").string()));
  EXPECT_EQ(int8["compression"], "int8");
  const double ratio =
      int8["bytes_sent_steps"].get<double>() / plain["bytes_sent_steps"].get<double>();
  EXPECT_GT(ratio, 0.25);  // one byte per value plus scales ...
  EXPECT_LT(ratio, 0.30);  // ... and padding of the small model's pieces to whole chunks
  EXPECT_NEAR(int8["final_loss"].get<double>(), plain["final_loss"].get<double>(), 0.1);
}

// randomk folds sgd's momentum m into its error feedback: the run is the one written with
// momentum 0 and learning rate lr / (1 - m) (here 0.05 / 0.5 = 0.1, exact in binary), and the
// report keeps the job as written and says what it folded.
TEST_F(Cli, RandomKRunsSgdWithoutMomentumAtTheFoldedRate) {
  write("job.yaml", kSmallJob);
  const std::string common =
      " --set comm.compression=randomk --set comm.ratio=0.25"
      " --set comm.compress_min_numel=0";
  auto r =
      run(krab("train job.yaml --report folded.json --set checkpoint.dir=folded"
               " --set train.optimizer.momentum=0.5" +
               common));
  ASSERT_EQ(r.code, 0) << r.output;
  r =
      run(krab("train job.yaml --set checkpoint.dir=manual --set comm.fold_momentum=false"
               " --set train.optimizer.momentum=0 --set train.optimizer.lr=0.1" +
               common));
  ASSERT_EQ(r.code, 0) << r.output;
  r =
      run(krab("train job.yaml --set checkpoint.dir=stacked --set comm.fold_momentum=false"
               " --set train.optimizer.momentum=0.5" +
               common));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto folded = load_model_pt((dir_ / "folded/model.pt").string());
  EXPECT_EQ(max_rel_diff(folded, load_model_pt((dir_ / "manual/model.pt").string())), 0);
  EXPECT_GT(max_rel_diff(folded, load_model_pt((dir_ / "stacked/model.pt").string())), 1e-3);
  const auto rep = nlohmann::json::parse(krab::core::read_file((dir_ / "folded.json").string()));
  EXPECT_EQ(rep["folded_momentum"]["momentum"], 0.5);
  EXPECT_EQ(rep["folded_momentum"]["lr"], 0.1);
  EXPECT_EQ(rep["config"]["train"]["optimizer"]["momentum"], 0.5);
}

// Local SGD with period 1 is synchronous SGD: averaging the models after every step equals
// averaging the gradients, momentum included (momentum is linear in the gradients). With
// period 4, models travel every 4th step: a quarter of the traffic (parameters and gradients
// have the same size).
TEST_F(Cli, LocalSgdPeriodOneIsSyncAndPeriodFourSendsAQuarter) {
  write("job.yaml", kSmallJob);
  const std::string common = " --set train.steps=20 --set parallel.workers=3";
  ASSERT_EQ(run(krab("train job.yaml --report sync.json --set checkpoint.dir=sync" + common)).code,
            0);
  auto r =
      run(krab("train job.yaml --report p1.json --set checkpoint.dir=p1 "
               "--set sync.mode=local_sgd --set sync.period=1" +
               common));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LE(max_rel_diff(load_model_pt((dir_ / "sync/model.pt").string()),
                         load_model_pt((dir_ / "p1/model.pt").string())),
            1e-5);
  r =
      run(krab("train job.yaml --report p4.json --set checkpoint.dir=p4 "
               "--set sync.mode=local_sgd --set sync.period=4" +
               common));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto sync = nlohmann::json::parse(krab::core::read_file((dir_ / "sync.json").string()));
  const auto p4 = nlohmann::json::parse(krab::core::read_file((dir_ / "p4.json").string()));
  EXPECT_EQ(p4["sync_mode"], "local_sgd");
  EXPECT_NEAR(p4["bytes_sent_steps"].get<double>() / sync["bytes_sent_steps"].get<double>(), 0.25,
              0.001);
  // Compression is for sync's gradients; local SGD is refused with it, naming both keys.
  expect_refused(run(krab("train job.yaml --set sync.mode=local_sgd --set comm.compression=fp16")),
                 2, "sync.mode");
}

TEST_F(Cli, CorruptDatasetFileIsNamed) {
  fs::create_directories(dir_ / "fm");
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
    write(std::string("fm/") + f, "garbage, not an IDX file");
  write("ok.yaml", kSmallJob);
  expect_refused(run(krab("train ok.yaml --set data.name=fashion-mnist --set data.path=fm")), 2,
                 "train-images-idx3-ubyte");
}

TEST_F(Cli, PortInUseIsNamed) {
  write("ok.yaml", kSmallJob);
  krab::comm::StoreServer holder("127.0.0.1", 0, std::chrono::seconds(5));
  const std::string port = std::to_string(holder.port());
  // (One node does not use a port: its rendezvous is a file, issue 17.)
  expect_refused(run(krab("train ok.yaml --nnodes 2 --node-rank 0 --rdzv 127.0.0.1:" + port)), 2,
                 port);
}

TEST_F(Cli, CheckpointFromAnotherModelOrCorruptIsRefused) {
  write("ok.yaml", kSmallJob);
  ASSERT_EQ(run(krab("train ok.yaml --set train.steps=2")).code, 0);
  expect_refused(run(krab("train ok.yaml --set checkpoint.resume=true --set model.hidden=16")), 2,
                 "fc1.weight is [32, 32] in the checkpoint, [16, 32] in this job");
  // Flip one byte in the payload.
  const std::string state = (dir_ / "runs/ok/step-00000002/state.krab").string();
  std::string bytes = krab::core::read_file(state);
  bytes[bytes.size() / 2] ^= 0x5a;
  std::ofstream(state, std::ios::binary) << bytes;
  expect_refused(run(krab("train ok.yaml --set checkpoint.resume=true")), 2, "CRC");
  // Truncated.
  std::ofstream(state, std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  expect_refused(run(krab("train ok.yaml --set checkpoint.resume=true")), 2, "truncated");
}

// A worker killed mid-run: the launcher names it, exits 1, and leaves no process behind.
TEST_F(Cli, DeadWorkerStopsTheRunAndIsNamed) {
  write("job.yaml", R"(
model: {name: mlp, hidden: 64}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 16}
train: {steps: 100000}
parallel: {workers: 3}
comm: {timeout_s: 10}
)");
  const std::string log = (dir_ / "log.txt").string();
  pid_t launcher = start_krab(dir_, log, {"train", "job.yaml"});
  // Find the workers: children of the launcher.
  std::vector<pid_t> workers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (workers.size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    workers = children_of(launcher);
  }
  ASSERT_EQ(workers.size(), 3u);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // let training start
  // Workers (exec'd by now) see torchrun's variables and an OpenBLAS pool limited to their
  // thread budget.
  for (size_t i = 0; i < workers.size(); ++i) {
    const std::string env = environ_of(workers[i]);
    for (const std::string& want :
         {"\nRANK=" + std::to_string(i) + "\n", "\nLOCAL_RANK=" + std::to_string(i) + "\n",
          std::string("\nWORLD_SIZE=3\n"), std::string("\nLOCAL_WORLD_SIZE=3\n"),
          std::string("\nOPENBLAS_NUM_THREADS=1\n")})
      EXPECT_NE(env.find(want), std::string::npos) << "worker " << i << " lacks " << want;
  }
  // Issue 17: the job secret reaches the workers in their environment (readable by this user
  // only), not on their command lines (readable by everyone in ps); the rendezvous is a file in
  // a directory only this user can enter.
  std::string secret, store_file;
  {
    const std::string env = environ_of(workers[0]);
    const auto at = env.find("\nKRAB_JOB_SECRET=");
    ASSERT_NE(at, std::string::npos) << env;
    secret = env.substr(at + 17, env.find('\n', at + 1) - at - 17);
    EXPECT_EQ(secret.size(), 64u) << secret;
    const auto f = env.find("\nKRAB_STORE_FILE=");
    ASSERT_NE(f, std::string::npos) << env;
    store_file = env.substr(f + 17, env.find('\n', f + 1) - f - 17);
    EXPECT_EQ(fs::status(store_file).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    EXPECT_EQ(fs::status(fs::path(store_file).parent_path()).permissions() & fs::perms::all,
              fs::perms::owner_all);
    for (pid_t p : {launcher, workers[0]})
      EXPECT_EQ(krab::core::read_file("/proc/" + std::to_string(p) + "/cmdline").find(secret),
                std::string::npos);
  }
  // Children are listed in spawn order: index 1 is rank 1.
  ::kill(workers[1], SIGKILL);
  int status = 0;
  if (!wait_exit(launcher, 30, status)) {
    for (pid_t w : workers) ::kill(w, SIGKILL);
    FAIL() << "launcher did not exit after a worker died";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string text = krab::core::read_file(log);
  EXPECT_NE(text.find("rank 1 was killed by signal 9"), std::string::npos) << text;
  for (pid_t w : workers) EXPECT_NE(::kill(w, 0), 0) << "worker " << w << " survived";
  EXPECT_FALSE(fs::exists(fs::path(store_file).parent_path())) << "the rendezvous was left";
}

// Parameter server with max_staleness 0 is sync data parallelism through the server: the same
// model as the all-reduce run, with the parameters sharded over two servers.
TEST_F(Cli, AsyncWithStalenessZeroMatchesSync) {
  write("job.yaml", kSmallJob);
  ASSERT_EQ(run(krab("train job.yaml --set checkpoint.dir=sync")).code, 0);
  auto r =
      run(krab("train job.yaml --report ps.json --set checkpoint.dir=ps --set sync.mode=async "
               "--set sync.servers=2 --set sync.max_staleness=0"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LE(max_rel_diff(load_model_pt((dir_ / "sync/model.pt").string()),
                         load_model_pt((dir_ / "ps/model.pt").string())),
            1e-5);
  const auto ps = nlohmann::json::parse(krab::core::read_file((dir_ / "ps.json").string()));
  EXPECT_EQ(ps["sync_mode"], "async");
  EXPECT_EQ(ps["backend"], "grpc");
  EXPECT_EQ(ps["async"]["servers"], 2);
  EXPECT_EQ(ps["async"]["pushes"], 2 * 20);  // shard 0's count: every worker's every step
  EXPECT_EQ(ps["async"]["updates"], 20);
  EXPECT_EQ(ps["async"]["workers_lost"], 0);
  EXPECT_EQ(ps["async"]["extrapolate"], false);  // nothing is stale to extrapolate over
  // Every step moves the gradient up and the parameters down: at least 4 bytes per parameter
  // each way, per worker and step.
  const double per_way = 2.0 * 20 * ps["gradient_bytes"].get<double>();
  EXPECT_GE(ps["bytes_sent_by_op"]["push"].get<double>(), per_way);
  EXPECT_LE(ps["bytes_sent_by_op"]["push"].get<double>(), per_way * 1.05);
  EXPECT_GE(ps["bytes_sent_by_op"]["pull"].get<double>(), per_way);
}

// One worker of three is slowed (a fixed delay per step). The job is 3 x 12 gradients,
// whoever computes them. Without a staleness bound the others do not wait for the slow one:
// they do nearly all the work. With max_staleness 2 nobody runs more than 2 steps ahead of it,
// so it does about a third.
TEST_F(Cli, AsyncSlowWorkerHoldsNobodyBackUnlessBounded) {
  write("job.yaml", kSmallJob);
  const std::string common =
      " --set parallel.workers=3 --set train.steps=12 --set sync.mode=async"
      " --set sync.servers=1 --set train.slow_rank=2"
      " --set train.slow_delay_ms=500";
  auto r = run(krab("train job.yaml --report free.json --set sync.max_staleness=-1" + common));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto free = nlohmann::json::parse(krab::core::read_file((dir_ / "free.json").string()));
  const auto& fw = free["async"]["per_worker"];
  ASSERT_EQ(fw.size(), 3u);
  const int64_t slow = fw[2]["steps"],
                fast = fw[0]["steps"].get<int64_t>() + fw[1]["steps"].get<int64_t>();
  EXPECT_LE(slow, 6) << free["async"].dump();
  EXPECT_GE(fast, 30) << free["async"].dump();
  // The work is done once: 36 gradients, plus at most one in flight per other worker.
  EXPECT_GE(slow + fast, 36);
  EXPECT_LE(slow + fast, 38);
  EXPECT_EQ(free["async"]["pushes"], slow + fast);
  EXPECT_EQ(free["async"]["extrapolate"], true);  // the default

  r = run(krab("train job.yaml --report bounded.json --set sync.max_staleness=2" + common));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto bounded =
      nlohmann::json::parse(krab::core::read_file((dir_ / "bounded.json").string()));
  EXPECT_LE(bounded["async"]["max_lead"].get<int64_t>(), 2) << bounded["async"].dump();
  EXPECT_GE(bounded["async"]["per_worker"][2]["steps"].get<int64_t>(), 10)
      << bounded["async"].dump();
}

// With a parameter server, a worker that dies does not stop training: the server counts it
// out after sync.worker_timeout_s, the others do its share of the work, the launcher exits 0
// and the report names the lost worker.
TEST_F(Cli, AsyncTrainingGoesOnWhenAWorkerDies) {
  // Rank 1 is slow and the others may not run more than 2 steps ahead of it: they cannot
  // finish before it is killed, and finish only because the server counts it out.
  write("job.yaml", R"(
model: {name: mlp, hidden: 64}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 16}
train: {steps: 400, slow_rank: 1, slow_delay_ms: 50}
parallel: {workers: 3}
sync: {mode: async, servers: 1, max_staleness: 2, worker_timeout_s: 1}
comm: {timeout_s: 20}
)");
  const std::string log = (dir_ / "log.txt").string();
  pid_t launcher = start_krab(dir_, log, {"train", "job.yaml", "--report", "r.json"});
  pid_t victim = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (victim < 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto kids = children_of(launcher);
    if (kids.size() < 4) continue;  // one server, three workers
    for (pid_t k : kids) {
      const std::string env = environ_of(k);
      if (env.find("\nRANK=1\n") != std::string::npos &&
          env.find("\nKRAB_PS_SHARD=") == std::string::npos)
        victim = k;
    }
  }
  ASSERT_GT(victim, 0) << "rank 1 was not found";
  std::this_thread::sleep_for(std::chrono::seconds(4));  // let training start
  ::kill(victim, SIGKILL);
  int status = 0;
  if (!wait_exit(launcher, 120, status)) FAIL() << "launcher did not finish after a worker died";
  const std::string text = krab::core::read_file(log);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("rank 1 was killed by signal 9"), std::string::npos) << text;
  EXPECT_NE(text.find("training goes on without it"), std::string::npos) << text;
  const auto rep = nlohmann::json::parse(krab::core::read_file((dir_ / "r.json").string()));
  EXPECT_EQ(rep["async"]["workers_lost"], 1) << rep["async"].dump();
  const auto& pw = rep["async"]["per_worker"];
  EXPECT_EQ(pw[1]["status"], "dead");
  EXPECT_EQ(pw[0]["status"], "finished");
  EXPECT_EQ(pw[2]["status"], "finished");
  const int64_t lost = pw[1]["steps"],
                kept = pw[0]["steps"].get<int64_t>() + pw[2]["steps"].get<int64_t>();
  EXPECT_LT(lost, 400);
  EXPECT_GE(lost + kept, 3 * 400);  // the survivors did the dead worker's share
  EXPECT_LE(lost + kept, 3 * 400 + 2);
  EXPECT_TRUE(fs::exists(dir_ / "runs/job/model.pt"));
}

TEST_F(Cli, BadAsyncSettingsAreRefusedWithExitTwo) {
  write("ok.yaml", kSmallJob);
  // Issue 17: across nodes the parameter servers listen on the network; without a job secret
  // anyone there could pull, push and stop them.
  expect_refused(run("cd " + dir_.string() + " && env -u KRAB_JOB_SECRET " + kKrab +
                     " train ok.yaml --set sync.mode=async --set sync.servers=1 --nnodes 2 "
                     "--node-rank 0 --rdzv 127.0.0.1:" +
                     std::to_string(free_port())),
                 2, "job secret");
  expect_refused(run(krab("train ok.yaml --set sync.mode=async")), 2, "sync.servers");
  expect_refused(run(krab("train ok.yaml --set sync.mode=async --set sync.servers=1 "
                          "--set comm.compression=fp16")),
                 2, "comm.compression");
  expect_refused(run(krab("train ok.yaml --set sync.mode=async --set sync.servers=1 "
                          "--set checkpoint.every_steps=5")),
                 2, "checkpoint.every_steps");
  expect_refused(run(krab("train ok.yaml --set sync.mode=async --set sync.servers=1 "
                          "--set sync.worker_timeout_s=0")),
                 2, "sync.worker_timeout_s");
  expect_refused(run(krab("train ok.yaml --set sync.mode=async --set sync.servers=1 "
                          "--set sync.aggregate=-1")),
                 2, "sync.aggregate");
  // Issue 27: a mirror lives on the next server, and only the parameter servers have shards.
  const Result one_server =
      run(krab("train ok.yaml --set sync.mode=async --set sync.servers=1 --set sync.replicas=1"));
  expect_refused(one_server, 2, "sync.replicas 1");
  expect_refused(one_server, 2, "sync.servers >= 2, got 1");
  const Result sync_mode = run(krab("train ok.yaml --set sync.replicas=1"));
  expect_refused(sync_mode, 2, "sync.replicas 1");
  expect_refused(sync_mode, 2, "needs sync.mode: async (sync.mode is 'sync')");
  expect_refused(run(krab("train ok.yaml --set sync.mode=async --set sync.servers=2 "
                          "--set sync.replicas=2")),
                 2, "sync.replicas");
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

// `krab privacy epsilon` prints epsilon alone on stdout; the expected values are the published
// ones of Opacus (tests of its RDP accountant: sigma 1.5, q 0.04, 2250 steps, delta 1e-5 ->
// 7.32911117143) and TF Privacy (compute_dp_sgd_privacy docstring: N 60000, batch 256,
// sigma 1.12, 60 epochs, delta 1e-5 -> 2.92 with the pre-2020 conversion).
TEST_F(Cli, PrivacyEpsilonMatchesOpacusAndTfPrivacy) {
  auto opacus =
      run(krab("privacy epsilon --noise-multiplier 1.5 --sampling-rate 0.04 "
               "--steps 2250 --delta 1e-5 2>/dev/null"));
  ASSERT_EQ(opacus.code, 0) << opacus.output;
  EXPECT_NEAR(std::stod(opacus.output), 7.32911117143, 1e-5);
  auto tfp =
      run(krab("privacy epsilon --noise-multiplier 1.12 --sampling-rate 0.00426666667 "
               "--steps 14063 --delta 1e-5 --conversion mironov2017 2>/dev/null"));
  ASSERT_EQ(tfp.code, 0) << tfp.output;
  EXPECT_NEAR(std::stod(tfp.output), 2.92, 0.005);
  const std::string ok = "--sampling-rate 0.04 --steps 10 --delta 1e-5";
  expect_refused(run(krab("privacy epsilon --noise-multiplier 0 " + ok)), 2, "--noise-multiplier");
  expect_refused(run(krab("privacy epsilon --noise-multiplier 1 --sampling-rate 0.04 --steps 10 "
                          "--delta 2")),
                 2, "--delta");
  expect_refused(run(krab("privacy epsilon --noise-multiplier 1 --steps 10 --delta 1e-5")), 2,
                 "--sampling-rate");
  expect_refused(run(krab("privacy epsilon --noise-multiplier 1 " + ok + " --conversion x")), 2,
                 "--conversion");
}

}  // namespace
