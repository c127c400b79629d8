// End-to-end: what `krab train` refuses with elastic.enabled (docs/design/elastic.md §7), each
// before anything is spawned, with exit 2 and a line that names both keys at odds.
#include "cli/cli_support.h"

namespace {

using namespace krab::cli_test;

class ElasticCli : public Cli {
 protected:
  // Refused with exit 2, naming every one of `needles`, before any worker trained.
  void expect_refusal(const std::string& sets, const std::vector<std::string>& needles) {
    write("job.yaml", kSmallJob);  // 2 workers, data.batch_size 32
    const Result r = run(krab("train job.yaml --set elastic.enabled=true " + sets), 60);
    EXPECT_EQ(r.code, 2) << sets << "\n" << r.output;
    for (const std::string& n : needles)
      EXPECT_NE(r.output.find(n), std::string::npos) << "no '" << n << "' in:\n" << r.output;
    EXPECT_EQ(r.output.find("train ["), std::string::npos) << "it trained first:\n" << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "runs")) << "something ran: " << sets;
  }
};

TEST_F(ElasticCli, MembershipBoundsAreRefusedNamingBothKeys) {
  expect_refusal("--set elastic.min_workers=5 --set elastic.max_workers=4",
                 {"elastic.min_workers 5 > elastic.max_workers 4"});
  expect_refusal("--set elastic.min_workers=3",
                 {"elastic.min_workers 3 > elastic.max_workers 0 (= parallel.workers 2)"});
  expect_refusal("--set elastic.min_workers=3 --set elastic.max_workers=4",
                 {"parallel.workers 2 is outside [elastic.min_workers 3, elastic.max_workers 4]"});
  expect_refusal("--nproc-per-node 3 --set elastic.max_workers=2",
                 {"--nproc-per-node 3 is outside [elastic.min_workers 1, elastic.max_workers 2]"});
  expect_refusal("--set data.batch_size=1 --set elastic.max_workers=4",
                 {"data.batch_size 1 x parallel.workers 2 = global batch of 2 examples < "
                  "elastic.max_workers 4"});
}

TEST_F(ElasticCli, ModesItDoesNotCoverAreRefusedNamingBothKeys) {
  expect_refusal("--set sync.mode=async",
                 {"elastic.enabled applies to sync.mode sync; sync.mode async already survives",
                  "covers its servers with sync.replicas: 1"});
  expect_refusal("--set sync.mode=local_sgd",
                 {"elastic.enabled with sync.mode local_sgd is not supported yet"});
  expect_refusal("--set comm.backend=mpi", {"elastic.enabled needs comm.backend gloo", "mpi"});
  expect_refusal("--set parallel.zero_stage=2 --set elastic.replicate_shards=false",
                 {"elastic.replicate_shards false with parallel.zero_stage 2 and "
                  "checkpoint.every_steps 0: a single failure would lose a shard"});
  expect_refusal("--set parallel.zero_stage=1 --set parallel.offload=disk",
                 {"elastic.enabled with parallel.offload disk is not built yet"});
  expect_refusal("--set elastic.lease_s=1", {"elastic.lease_s"});
}

TEST_F(ElasticCli, AutoscaleWithoutRoomOrWithCrossedThresholdsIsRefused) {
  expect_refusal("--set elastic.autoscale.provider=local",
                 {"elastic.autoscale.provider local with elastic.max_workers 0 (= "
                  "parallel.workers 2): no room to add a worker"});
  expect_refusal(
      "--set elastic.autoscale.provider=local --set elastic.max_workers=4 "
      "--set elastic.autoscale.down_efficiency=0.7",
      {"elastic.autoscale.down_efficiency 0.7 > elastic.autoscale.up_efficiency 0.6"});
  write("job.yaml", kSmallJob);
  const Result r = run(krab("train job.yaml --set elastic.autoscale.provider=local"), 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("elastic.autoscale.provider local needs elastic.enabled: true"),
            std::string::npos)
      << r.output;
}

// provider slurm needs Slurm's client in PATH and a controller that answers; both are checked
// before anything is spawned, with exit 2 naming the key.
TEST_F(ElasticCli, SlurmProviderWithoutSlurmIsRefused) {
  const std::string sets = "--set elastic.autoscale.provider=slurm --set elastic.max_workers=3 ";
  write("job.yaml", kSmallJob);
  // The variable before the command sets it for krab alone (krab() starts with a cd).
  auto with = [&](const std::string& var) {
    return "cd " + dir_.string() + " && " + var + " " + kKrab +
           " train job.yaml --set elastic.enabled=true " + sets;
  };
  const Result no_client = run(with("PATH=" + (dir_ / "no-slurm-here").string()), 60);
  EXPECT_EQ(no_client.code, 2) << no_client.output;
  EXPECT_NE(no_client.output.find("elastic.autoscale.provider slurm: sbatch is not in PATH: "
                                  "slurm-wlm's client is not installed; or provider: local"),
            std::string::npos)
      << no_client.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs")) << no_client.output;
  if (std::system("command -v sinfo >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no sinfo: the dead-controller case needs Slurm's client";
  // A controller on a port nobody listens on: sinfo gives up after its retries (~9 s).
  write("dead.conf", "ClusterName=krabdead\nSlurmctldHost=localhost\nSlurmctldPort=" +
                         std::to_string(free_port()) +
                         "\nAuthType=auth/none\nCredType=cred/none\n"
                         "NodeName=localhost CPUs=1 State=UNKNOWN\n"
                         "PartitionName=t Nodes=localhost Default=YES State=UP\n");
  const Result dead = run(with("SLURM_CONF=" + (dir_ / "dead.conf").string()), 90);
  EXPECT_EQ(dead.code, 2) << dead.output;
  EXPECT_NE(dead.output.find("elastic.autoscale.provider slurm: the Slurm controller does not "
                             "answer: slurm_load_partitions: Unable to contact slurm controller"),
            std::string::npos)
      << dead.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs")) << dead.output;
}

// The same job without elastic.enabled is not refused by any of these checks.
TEST_F(ElasticCli, ElasticKeysAreInertWhenDisabled) {
  write("job.yaml", kSmallJob);
  const Result r = run(krab("train job.yaml --set train.steps=2 --set elastic.min_workers=5 "
                            "--set elastic.replace_dead=true"),
                       120);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs/job/workers.json")) << "elastic files without elastic";
}

// Across machines: the rendezvous flags at odds with each other or with the job, a join
// without what it needs, and an etcd that does not answer (named, exit 2, within
// comm.timeout_s) — all before anything is spawned.
TEST_F(ElasticCli, RendezvousAcrossMachinesIsRefusedWhereItCannotWork) {
  write("secret", "0123456789abcdef0123456789abcdef\n");
  const std::string two = "--nnodes 2 --node-rank 1 --job-secret-file secret ";
  expect_refusal(two + "--rdzv-backend etcd",
                 {"--rdzv-backend etcd needs --rdzv-endpoints HOST:PORT"});
  expect_refusal(two + "--rdzv 127.0.0.1:29400 --rdzv-endpoints 127.0.0.1:2379",
                 {"--rdzv-endpoints 127.0.0.1:2379 is for --rdzv-backend etcd"});
  expect_refusal(two + "--rdzv-backend zookeeper --rdzv-endpoints 127.0.0.1:2379",
                 {"--rdzv-backend 'zookeeper': c10d or etcd"});
  expect_refusal(two + "--rdzv-backend etcd --rdzv-endpoints 127.0.0.1:2379 --rdzv 1.2.3.4:5",
                 {"with --rdzv-backend etcd the machines find node 0's store through etcd"});
  expect_refusal(two +
                     "--rdzv-backend etcd --rdzv-endpoints 127.0.0.1:2379 "
                     "--set elastic.enabled=false",
                 {"--rdzv-backend etcd keeps the membership of an elastic run"});
  expect_refusal("--join 127.0.0.1:29400 --node-rank 1",
                 {"--join takes no --nnodes, --node-rank or --rdzv"});
  expect_refusal("--join 127.0.0.1:29400", {"a machine joins with the running job's secret"});
  expect_refusal("--join 127.0.0.1:29400 --job-secret-file secret --set elastic.enabled=false",
                 {"only an elastic run takes machines while it trains"});
  // Nothing listens on the port: etcd unreachable, named with the bound it waited.
  const std::string closed = "127.0.0.1:" + std::to_string(free_port());
  const auto t0 = std::chrono::steady_clock::now();
  expect_refusal(two + "--rdzv-backend etcd --rdzv-endpoints " + closed + " --set comm.timeout_s=2",
                 {"--rdzv-endpoints " + closed, "no etcd answered within 2 s (comm.timeout_s)"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

}  // namespace
