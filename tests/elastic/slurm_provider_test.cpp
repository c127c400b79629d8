// The Slurm provider (elastic/providers/slurm.h) against fake sbatch, scancel, sinfo and squeue
// scripts in a temporary directory: what each call runs (arguments and environment, read back
// from the fakes' logs), what it makes of the answers, and the refusals of a missing client or
// a controller that does not answer. The real single-node cluster is
// tests/elastic/slurm_autoscale.sh's (label slurm). Also the bounded command runner.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "core/errors.h"
#include "core/fs.h"
#include "elastic/providers/slurm.h"

namespace krab::elastic {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kSecret = "KRAB_JOB_SECRET=0123456789abcdef0123456789abcdef";

// A bin directory of fake clients that log each call ("<name> <args...>" per line, and the
// sbatch call's environment in sbatch.env) and answer from files the test writes.
struct FakeSlurm {
  fs::path dir;
  FakeSlurm() {
    std::string templ = (fs::temp_directory_path() / "krab-fake-slurm-XXXXXX").string();
    KRAB_CHECK(::mkdtemp(templ.data()) != nullptr, "mkdtemp");
    dir = templ;
    client("sbatch", "env > \"$D/sbatch.env\"; cat \"$D/sbatch.answer\"");
    client("scancel", "true");
    client("sinfo", "cat \"$D/sinfo.answer\"");
    client("squeue", "cat \"$D/squeue.answer\"");
    answer("sbatch", "42;krabtest\n");
    answer("sinfo", "1/3/0/4\n");
    answer("squeue", "");
  }
  ~FakeSlurm() { fs::remove_all(dir); }
  void client(const std::string& name, const std::string& body) const {
    const std::string path = (dir / name).string();
    core::write_file_atomic(path, str_cat("#!/bin/sh\nD='", dir.string(), "'\necho ", name,
                                          " \"$@\" >> \"$D/calls\"\n", body, "\n"));
    ::chmod(path.c_str(), 0755);
  }
  void answer(const std::string& name, const std::string& text) const {
    core::write_file_atomic((dir / (name + ".answer")).string(), text);
  }
  std::string calls() const {
    return fs::exists(dir / "calls") ? core::read_file((dir / "calls").string()) : "";
  }
  std::vector<std::string> env() const { return {"PATH=" + dir.string() + ":/usr/bin:/bin"}; }
  SlurmOptions options() const {
    SlurmOptions o;
    o.clients = find_slurm_clients(dir.string());
    o.job_name = "krab-test";
    o.run_dir = "/run/dir";
    o.env = env();
    o.timeout = 5s;
    o.refresh = 0ms;
    o.end_grace = 200ms;
    return o;
  }
};

WorkerSpec spec() {
  return {MemberId{0, 1, 0},
          {"/opt/krab/bin/krab", "train", "it's job.yaml"},
          {"KRAB_MEMBER_ID=0.1.0", "KRAB_ELASTIC_JOIN=1", kSecret, "PATH=/usr/bin:/bin"}};
}

TEST(SlurmParse, AnswersOfTheClients) {
  EXPECT_EQ(parse_idle_cpus("2/0/0/2\n"), 0);
  EXPECT_EQ(parse_idle_cpus("1/3/0/4\n0/2/0/2\n"), 5);
  EXPECT_EQ(parse_idle_cpus(""), std::nullopt);
  EXPECT_EQ(parse_idle_cpus("sinfo: error: no\n"), std::nullopt);
  EXPECT_EQ(parse_sbatch_id("17\n"), "17");
  EXPECT_EQ(parse_sbatch_id("17;krabtest\n"), "17");
  EXPECT_EQ(parse_sbatch_id("Submitted batch job 17\n"), std::nullopt);
  EXPECT_EQ(slurm_wrap({"/a b/krab", "it's"}), "exec '/a b/krab' 'it'\\''s'");
  const auto states = parse_squeue("17 RUNNING\n18 PENDING\n");
  EXPECT_EQ(states.at("17"), "RUNNING");
  EXPECT_EQ(states.at("18"), "PENDING");
}

TEST(SlurmProvider, RefusesWithoutTheClientsNamingTheKey) {
  try {
    find_slurm_clients("/nonexistent-dir");
    FAIL() << "no refusal";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("elastic.autoscale.provider slurm: sbatch is not in PATH"), std::string::npos)
        << m;
    EXPECT_NE(m.find("or provider: local"), std::string::npos) << m;
  }
}

TEST(SlurmProvider, RefusesWhenTheControllerDoesNotAnswer) {
  FakeSlurm fake;
  EXPECT_EQ(check_slurm_controller(fake.options().clients, fake.env(), 5s), 3);
  fake.client("sinfo", "echo 'sinfo: error: Unable to contact slurm controller' >&2; exit 1");
  try {
    check_slurm_controller(fake.options().clients, fake.env(), 5s);
    FAIL() << "no refusal";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the Slurm controller does not answer: sinfo: error: "
                                         "Unable to contact slurm controller"),
              std::string::npos)
        << e.what();
  }
  fake.client("sinfo", "exec sleep 30");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(check_slurm_controller(fake.options().clients, fake.env(), 300ms), InvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(SlurmProvider, SubmitsTheWorkerWithItsSecretInTheEnvironmentOnly) {
  FakeSlurm fake;
  SlurmProvider provider(fake.options());
  const WorkerHandle h = provider.add(spec());
  EXPECT_EQ(h.id, "42");
  EXPECT_EQ(h.member, (MemberId{0, 1, 0}));
  const std::string calls = fake.calls();
  EXPECT_NE(calls.find("sbatch --parsable --job-name=krab-test --ntasks=1 --export=ALL "
                       "--output=/run/dir/slurm-%j.out --wrap exec '/opt/krab/bin/krab' 'train' "
                       "'it'\\''s job.yaml'"),
            std::string::npos)
      << calls;
  EXPECT_EQ(calls.find("0123456789abcdef"), std::string::npos) << calls;
  const std::string env = core::read_file((fake.dir / "sbatch.env").string());
  EXPECT_NE(env.find(kSecret), std::string::npos);
  EXPECT_NE(env.find("KRAB_MEMBER_ID=0.1.0"), std::string::npos);
  EXPECT_NE(env.find("KRAB_ELASTIC_JOIN=1"), std::string::npos);
  provider.remove(h);
  EXPECT_NE(fake.calls().find("scancel --batch --signal=TERM 42"), std::string::npos);
  provider.kill(h);
  EXPECT_NE(fake.calls().find("scancel --full --signal=KILL 42"), std::string::npos);
  EXPECT_EQ(provider.capacity(), 3);
  fake.answer("squeue", "42 COMPLETED\n");  // shutdown finds nothing to stop
}

TEST(SlurmProvider, AFailedSubmissionNamesTheCommandAndItsError) {
  FakeSlurm fake;
  fake.client("sbatch", "echo 'sbatch: error: invalid partition specified: gpu' >&2; exit 1");
  SlurmProvider provider(fake.options());
  try {
    provider.add(spec());
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("member 0.1.0"), std::string::npos) << m;
    EXPECT_NE(m.find("`sbatch --parsable"), std::string::npos) << m;
    EXPECT_NE(m.find("exited with status 1: sbatch: error: invalid partition specified: gpu"),
              std::string::npos)
        << m;
  }
  EXPECT_TRUE(provider.live_jobs().empty());
}

TEST(SlurmProvider, APendingJobPastTheLimitIsCancelledAndGivenUp) {
  FakeSlurm fake;
  SlurmOptions o = fake.options();
  o.pending_limit = 0ms;
  SlurmProvider provider(o);
  provider.add(spec());
  fake.answer("squeue", "42 PENDING\n");
  const std::vector<WorkerHandle> gone = provider.poll();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, "42");
  EXPECT_NE(fake.calls().find("scancel 42"), std::string::npos) << fake.calls();
  EXPECT_TRUE(provider.live_jobs().empty());
}

TEST(SlurmProvider, RunningJobsStayAndEndedOnesAreGone) {
  FakeSlurm fake;
  SlurmOptions o = fake.options();
  o.pending_limit = 3600s;
  SlurmProvider provider(o);
  provider.add(spec());
  fake.answer("squeue", "42 PENDING\n");
  EXPECT_TRUE(provider.poll().empty());
  fake.answer("squeue", "42 RUNNING\n");
  EXPECT_TRUE(provider.poll().empty());
  fake.answer("squeue", "42 FAILED\n");
  EXPECT_EQ(provider.poll().size(), 1u);
  EXPECT_TRUE(provider.live_jobs().empty());
}

TEST(SlurmProvider, ShutdownStopsARunningJobThenKillsIt) {
  FakeSlurm fake;
  fake.answer("squeue", "42 RUNNING\n");  // never ends, whatever it is sent
  {
    SlurmOptions o = fake.options();
    o.timeout = 500ms;  // the last wait is 2 x timeout
    SlurmProvider provider(o);
    provider.add(spec());
    provider.shutdown();
    EXPECT_TRUE(provider.live_jobs().empty());
  }
  const std::string calls = fake.calls();
  const size_t term = calls.find("scancel --batch --signal=TERM 42");
  const size_t kill = calls.find("scancel --full --signal=KILL 42");
  ASSERT_NE(term, std::string::npos) << calls;
  ASSERT_NE(kill, std::string::npos) << calls;
  EXPECT_LT(term, kill);
}

TEST(RunCommand, KillsAProgramPastItsDeadline) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = run_command({"/bin/sleep", "30"}, {}, 200ms);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.status, -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  const CommandResult ok =
      run_command({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, {"PATH=/usr/bin:/bin"}, 5s);
  EXPECT_EQ(ok.status, 3);
  EXPECT_EQ(ok.out, "out\n");
  EXPECT_EQ(ok.err, "err\n");
}

}  // namespace
}  // namespace krab::elastic
