// Unit tests of what the launcher decides without a network: the node fingerprint and its
// comparison (job_agreement.h), the worker memory estimate (resources.h) and the launch plan.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "cli/job_agreement.h"
#include "cli/launcher.h"
#include "cli/resources.h"
#include "comm/store.h"
#include "core/errors.h"

namespace krab::cli {
namespace {

core::Config job(const std::vector<std::string>& sets = {}) {
  return core::Config::parse("train: {steps: 30}\n", "job.yaml", sets);
}

TEST(JobAgreement, TheSameJobHasNoDifference) {
  const Fingerprint a = job_fingerprint(job(), 2, 4);
  EXPECT_EQ(first_difference(a, job_fingerprint(job(), 2, 4), 1), "");
  EXPECT_EQ(decode(encode(a)), a);
}

TEST(JobAgreement, TheFirstDifferingKeyIsNamedWithBothValues) {
  const Fingerprint node0 = job_fingerprint(job(), 2, 4);
  const Fingerprint node1 =
      job_fingerprint(job({"train.steps=20", "train.optimizer.lr=0.5"}), 2, 4);
  // Registry order: train.steps comes before train.optimizer.lr.
  EXPECT_EQ(first_difference(node0, node1, 1),
            "node 1's job differs from node 0's at key train.steps: '20' vs '30'");
  EXPECT_NE(first_difference(node0, job_fingerprint(job(), 2, 2), 3).find("workers per node"),
            std::string::npos);
}

TEST(JobAgreement, PerNodeKeysMayDiffer) {
  const Fingerprint node0 = job_fingerprint(job(), 2, 1);
  const Fingerprint node1 = job_fingerprint(
      job({"name=other", "checkpoint.dir=/elsewhere", "data.path=/mnt/data",
           "data.test_path=/mnt/test", "comm.iface=eth1", "train.threads_per_worker=4"}),
      2, 1);
  EXPECT_EQ(first_difference(node0, node1, 1), "");
  for (const std::string& key : per_node_keys()) EXPECT_NE(core::find_key(key), nullptr) << key;
}

// A scratch file holding `text`, removed with the test's temp dir.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  return path;
}

TEST(JobAgreement, ModelFilesAreComparedByContentNotPath) {
  const std::string here = write_file("node0.pt", "the same module");
  const std::string there = write_file("node1.pt", "the same module");
  const std::string other = write_file("other.pt", "another module!");
  const auto with_model = [](const std::string& path) {
    return job_fingerprint(job({"model.name=torchscript", "model.path=" + path}), 2, 1);
  };
  // Same bytes under another path: the same job.
  EXPECT_EQ(first_difference(with_model(here), with_model(there), 1), "");
  // Different bytes (same size): refused, naming the key and neither path.
  const std::string diff = first_difference(with_model(here), with_model(other), 1);
  EXPECT_EQ(diff.find("node 1's job differs from node 0's at key model.path: 'file content "), 0u)
      << diff;
  EXPECT_EQ(diff.find(here), std::string::npos);
  // A node that cannot read the file says so instead of passing for equal.
  EXPECT_NE(first_difference(with_model(here), with_model(here + ".missing"), 1)
                .find("(unreadable on this node)"),
            std::string::npos);
  // The tokenizer model shapes the model too.
  const auto with_spm = [](const std::string& path) {
    return job_fingerprint(job({"data.tokenizer.sentencepiece=" + path}), 2, 1);
  };
  EXPECT_EQ(first_difference(with_spm(here), with_spm(there), 1), "");
  EXPECT_NE(first_difference(with_spm(here), with_spm(other), 1), "");
  for (const std::string& key : content_keys()) EXPECT_NE(core::find_key(key), nullptr) << key;
}

// The content digest is SHA-256 of the file's bytes, as coreutils' sha256sum computes it.
TEST(JobAgreement, TheContentDigestIsTheFilesSha256) {
  std::string bytes;
  for (int i = 0; i < 200000; ++i) bytes += static_cast<char>((i * 131 + i / 7) & 0xff);
  const std::string path = write_file("digest.pt", bytes);
  std::string expected;
  {
    std::FILE* p = ::popen(("sha256sum " + path).c_str(), "r");
    ASSERT_NE(p, nullptr);
    char hex[65] = {};
    ASSERT_EQ(std::fscanf(p, "%64s", hex), 1);
    ASSERT_EQ(::pclose(p), 0);
    expected = hex;
  }
  ASSERT_EQ(expected.size(), 64u);
  const Fingerprint f =
      job_fingerprint(job({"model.name=torchscript", "model.path=" + path}), 2, 1);
  const auto it =
      std::find_if(f.begin(), f.end(), [](const auto& kv) { return kv.first == "model.path"; });
  ASSERT_NE(it, f.end());
  EXPECT_EQ(it->second, "file content " + expected + ", 200000 bytes");
}

TEST(JobAgreement, NodesExchangeThroughTheStore) {
  comm::StoreServer server("127.0.0.1", 0, std::chrono::seconds(10));
  const comm::Endpoint at{"127.0.0.1", server.port()};
  const auto timeout = std::chrono::seconds(10);
  Node0Outputs outputs{"/runs/job", "/tmp/report.json"};
  Node0Outputs seen;
  std::string node1_error;
  std::thread node1([&] {
    try {
      seen = agree_on_job(comm::connect_store(at, timeout), 1, 3,
                          job_fingerprint(job({"train.steps=20"}), 3, 1), {}, at, timeout);
    } catch (const InvalidArgument& e) {
      node1_error = e.what();
    }
  });
  // Node 2 never comes: node 0 names node 1's difference without waiting for it.
  const std::string want = "node 1's job differs from node 0's at key train.steps: '20' vs '30'";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(
      {
        try {
          agree_on_job(server.store(), 0, 3, job_fingerprint(job(), 3, 1), outputs, at, timeout);
        } catch (const InvalidArgument& e) {
          EXPECT_EQ(e.what(), want);
          throw;
        }
      },
      InvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  node1.join();
  EXPECT_EQ(node1_error, want);
}

TEST(JobAgreement, NodeOneLearnsWhereNodeZeroWritesAndAMissingNodeIsNamed) {
  comm::StoreServer server("127.0.0.1", 0, std::chrono::seconds(10));
  const comm::Endpoint at{"127.0.0.1", server.port()};
  const auto timeout = std::chrono::seconds(10);
  Node0Outputs seen;
  std::thread node1([&] {
    seen = agree_on_job(comm::connect_store(at, timeout), 1, 3, job_fingerprint(job(), 3, 1), {},
                        at, timeout);
  });
  try {
    agree_on_job(server.store(), 0, 3, job_fingerprint(job(), 3, 1), {"/runs/job", "/r.json"}, at,
                 std::chrono::seconds(1));
    ADD_FAILURE() << "node 2 never came, yet node 0 went on";
  } catch (const Timeout& e) {
    EXPECT_NE(
        std::string(e.what()).find("node(s) 2 did not reach the rendezvous at " + at.to_string()),
        std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("comm.timeout_s"), std::string::npos) << e.what();
  }
  node1.join();
  EXPECT_EQ(seen.run_dir, "/runs/job");
  EXPECT_EQ(seen.report, "/r.json");
}

TEST(Resources, EstimateAddsFixedDataAndModelTerms) {
  const WorkerFootprint f = estimate_worker_memory(100 << 20, 1000000);
  EXPECT_EQ(f.fixed_bytes, int64_t{192} << 20);
  EXPECT_EQ(f.data_bytes, int64_t{200} << 20);
  EXPECT_EQ(f.model_bytes, 20000000);
  EXPECT_EQ(f.total(), f.fixed_bytes + f.data_bytes + f.model_bytes);
}

TEST(Resources, TooManyWorkersAreRefusedNamingKeyAndBothNumbers) {
  const WorkerFootprint f = estimate_worker_memory(0, 0);  // 192 MiB each
  EXPECT_NO_THROW(check_memory(4, f, int64_t{1} << 30, "parallel.workers"));
  try {
    check_memory(500, f, int64_t{24} << 30, "parallel.workers");
    ADD_FAILURE() << "500 x 192 MiB fit in 24 GiB?";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parallel.workers: 500 worker processes"), std::string::npos) << what;
    EXPECT_NE(what.find("94 GiB"), std::string::npos) << what;
    EXPECT_NE(what.find("24 GiB available"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(check_memory(500, f, -1, "parallel.workers"));  // unknown: not refused
  EXPECT_GT(available_memory_bytes(), 0);
  EXPECT_GE(usable_cores(), 1);
}

TEST(LaunchPlan, NprocPerNodeZeroIsTheDefaultOnlyWhenNotGiven) {
  LaunchFlags flags;
  flags.nnodes = 2;
  flags.rdzv = "127.0.0.1:29500";
  EXPECT_EQ(plan_launch(flags, 4, {}).nproc_per_node, 2);
  flags.nproc_per_node = 3;
  EXPECT_EQ(plan_launch(flags, 4, {}).world_size, 6);
  flags.rdzv = "127.0.0.1:99999";
  EXPECT_THROW(plan_launch(flags, 4, {}), InvalidArgument);
}

// Issue 17: krab's workers find a one-node job's store in a file, and the job secret, in their
// environment (the launcher puts them there; never on a command line).
TEST(LaunchPlan, WorkersTakeTheStoreFileAndTheSecretFromTheEnvironment) {
  const std::map<std::string, std::string> env = {{"KRAB_WORKER", "1"},
                                                  {"RANK", "1"},
                                                  {"WORLD_SIZE", "2"},
                                                  {"MASTER_ADDR", "127.0.0.1"},
                                                  {"KRAB_STORE_FILE", "/tmp/x/store"},
                                                  {"KRAB_JOB_SECRET", "0123456789abcdef0123"}};
  const LaunchPlan p = plan_launch({}, 2, env);
  EXPECT_EQ(p.rendezvous.file, "/tmp/x/store");
  EXPECT_EQ(p.rendezvous.secret, "0123456789abcdef0123");
  EXPECT_EQ(p.rendezvous.to_string().find("0123456789abcdef"), std::string::npos);
}

// Issue 17: a store client from elsewhere read and overwrote krab/ps/0. With a job secret the
// job's keys live under a name derived from it: a client without it (or with another) does not
// see them, and what it writes under that name is not what the job reads.
TEST(Store, KeysLiveUnderTheSecretsName) {
  const std::string secret = "the job secret, 32 characters.";
  comm::StoreServer server("127.0.0.1", 0, std::chrono::seconds(10), secret);
  server.store()->set("krab/ps/0", {'a'});
  const auto timeout = std::chrono::seconds(5);
  comm::Endpoint at{"127.0.0.1", server.port()};
  auto outsider = comm::connect_store(at, timeout);
  EXPECT_FALSE(outsider->check({"krab/ps/0"}));
  outsider->set("krab/ps/0", {'x'});
  at.secret = secret + "!";
  EXPECT_FALSE(comm::connect_store(at, timeout)->check({"krab/ps/0"}));
  at.secret = secret;
  EXPECT_EQ(comm::connect_store(at, timeout)->get("krab/ps/0"), std::vector<uint8_t>{'a'});
}

// One node: the store is a file only this user can read, shared through its path.
TEST(Store, OneNodeStoreIsAPrivateFile) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "krab-store-test-XXXXXX").string();
  char* dir = ::mkdtemp(tmpl.data());
  ASSERT_NE(dir, nullptr);
  const comm::Endpoint at{"127.0.0.1", 0, std::string(dir) + "/store", "secret secret secret"};
  {
    comm::StoreServer server(at);
    EXPECT_EQ(server.port(), 0);
    server.store()->set("k", {'v'});
    struct stat st {};
    ASSERT_EQ(::stat(at.file.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(comm::connect_store(at, std::chrono::seconds(5))->get("k"),
              std::vector<uint8_t>{'v'});
  }
  ::unlink(at.file.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace krab::cli
