// What `krab train` writes, in a directory others can write to: a farm of symlinks at the
// temporary names the old atomic writer would pick (REPORT.tmp.<pid>, for the pids the run's
// processes will get) does not redirect the report into the symlinks' target, and the run
// directory and its state are the owner's alone.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "cli_support.h"

namespace krab::cli_test {
namespace {

// The mode in octal ("0600"), so that a failure reads like ls -l.
std::string mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", st.st_mode & 07777);
  return text;
}

// The pids the processes of the next run will get: the 2048 after the last pid handed out
// (Linux hands them out in order, wrapping at pid_max to 300). Planting all 32768 of a small
// pid_max takes some 20 s on a loaded disk; the next 2048 cover a run unless thousands of
// processes start elsewhere while the farm is planted.
std::vector<long> next_pids() {
  long pid_max = 32768, last = ::getpid();
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  std::ifstream("/proc/sys/kernel/ns_last_pid") >> last;
  std::vector<long> pids;
  for (long i = 1, p = last; i <= 2048; ++i) {
    p = p + 1 < pid_max ? p + 1 : 300;
    pids.push_back(p);
  }
  return pids;
}

TEST_F(Cli, ASymlinkFarmDoesNotRedirectTheReportAndTheRunIsPrivate) {
  write("job.yaml", kSmallJob);
  const fs::path victim = write("victim", "precious\n");
  const fs::path shared = dir_ / "shared";
  fs::create_directories(shared);
  for (long pid : next_pids())
    fs::create_symlink(victim, shared / ("report.json.tmp." + std::to_string(pid)));

  const mode_t old_umask = ::umask(022);
  const Result r = run(krab("train job.yaml --report shared/report.json --set train.steps=4"), 120);
  ::umask(old_umask);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(core::read_file(victim.string()).substr(0, 40), "precious\n")
      << "the report was written into the symlink farm's target";
  ASSERT_FALSE(fs::is_symlink(shared / "report.json"));
  EXPECT_NE(core::read_file((shared / "report.json").string()).find("\"steps\""),
            std::string::npos);

  // Modes: the run directory (and the runs/ above it, which krab created) 0700, the state 0600;
  // the report and model.pt are outputs, 0644 less the umask.
  EXPECT_EQ(mode_of(dir_ / "runs"), "0700");
  EXPECT_EQ(mode_of(dir_ / "runs/job"), "0700");
  int states = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "runs/job")) {
    if (e.path().filename() == "state.krab") {
      ++states;
      EXPECT_EQ(mode_of(e.path()), "0600") << e.path();
      EXPECT_EQ(mode_of(e.path().parent_path()), "0700") << e.path();
    }
  }
  EXPECT_GE(states, 1);
  EXPECT_EQ(mode_of(dir_ / "runs/job/latest"), "0600");
  EXPECT_EQ(mode_of(dir_ / "runs/job/model.pt"), "0644");
  EXPECT_EQ(mode_of(shared / "report.json"), "0644");
}

// `krab export RUN_DIR` writes the model.pt the run wrote, from its final state.krab; a
// corrupt checkpoint or a missing --step is refused with exit 2 naming the file or flag.
TEST_F(Cli, ExportWritesTheRunsModelAndRefusesACorruptCheckpoint) {
  write("job.yaml", kSmallJob);
  auto r = run(krab("train job.yaml --set checkpoint.dir=run --set train.steps=4"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto e = run(krab("export run --out exported.pt"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(max_rel_diff(load_model_pt((dir_ / "exported.pt").string()),
                         load_model_pt((dir_ / "run/model.pt").string())),
            0.0);
  expect_refused(run(krab("export run --step 3")), 2, "--step 3");
  const fs::path state = dir_ / "run/step-00000004/state.krab";
  {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  expect_refused(run(krab("export run")), 2, "state.krab");
}

}  // namespace
}  // namespace krab::cli_test
