// krab's own state files, state.krab and fl-state.krab, as an attacker who can write the run
// directory hands them back, run through the `krab` binary:
//  - a file of the first formats (a TorchScript archive behind a valid frame) whose module's
//    __setstate__ creates a file is refused by name, and the file is never created: nothing in
//    it ran (tests/train/forge_state.py makes it with Python's torch);
//  - with checkpoint.hmac_key_file, a sealed fl-state.krab put back from an earlier round, or
//    deleted, is refused rather than resumed from (the privacy budget would be under-reported),
//    and a sealed file from another run is refused in this one.
#include "cli/cli_support.h"

namespace krab::cli_test {
namespace {

const char* kTrainJob = R"(
model: {name: mlp, hidden: 8}
data: {name: synthetic, synthetic_samples: 256, batch_size: 32}
train: {steps: 4, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 1}
checkpoint: {dir: run}
)";

const char* kFlJob = R"(
model: {name: mlp, hidden: 8}
data: {name: synthetic, synthetic_samples: 400, synthetic_features: 8, synthetic_classes: 2, batch_size: 20}
train: {seed: 7, optimizer: {name: sgd, lr: 0.05, momentum: 0}}
federated: {clients: 4, fraction: 1.0, min_clients: 2, rounds: 3}
checkpoint: {dir: run}
)";

class StateFiles : public Cli {
 protected:
  // Writes a forged state file of the first format of `kind` ("checkpoint" or "fl-state") at
  // `out`, whose loading would create `target`.
  void forge(const std::string& kind, const fs::path& target, const fs::path& out) {
    fs::create_directories(out.parent_path());
    const Result r =
        run(std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR + "/tests/train/forge_state.py " +
                kind + " " + target.string() + " " + out.string(),
            120);
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_FALSE(fs::exists(target));
  }
  // A key outside the run directory; the release counter is kept beside it.
  std::string key() {
    fs::create_directories(dir_ / "keys");
    return write("keys/key", std::string(64, 'k'));
  }
  Result fl_sim(const std::string& set) { return run(krab("fl-sim fl.yaml" + set), 120); }
};

TEST_F(StateFiles, AForgedCheckpointOfTheFirstFormatRunsNothing) {
  write("job.yaml", kTrainJob);
  const fs::path target = dir_ / "written-by-the-checkpoint";
  forge("checkpoint", target, dir_ / "run" / "step-00000002" / "state.krab");
  write("run/latest", "step-00000002\n");
  const Result r = run(krab("train job.yaml --set checkpoint.resume=true"), 120);
  expect_refused(r, 2, "run/step-00000002/state.krab");
  EXPECT_NE(r.output.find("format version 1"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(target)) << "loading the checkpoint ran its code";
}

TEST_F(StateFiles, AForgedFlStateOfTheFirstFormatRunsNothing) {
  write("fl.yaml", kFlJob);
  const fs::path target = dir_ / "written-by-the-fl-state";
  forge("fl-state", target, dir_ / "run" / "fl-state.krab");
  const Result r = fl_sim(" --set checkpoint.resume=true");
  expect_refused(r, 2, "run/fl-state.krab");
  EXPECT_NE(r.output.find("KRABFLS1"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(target)) << "loading the server state ran its code";
}

// Round 3's sealed state put back after round 6 would resume at round 3 and report the privacy
// cost of 6 rounds when 9 were released; deleting it would start again from round 0.
TEST_F(StateFiles, ASealedFlStatePutBackOrDeletedIsRefused) {
  write("fl.yaml", kFlJob);
  const std::string sealed = " --set checkpoint.hmac_key_file=" + key();
  ASSERT_EQ(fl_sim(sealed).code, 0);
  fs::copy_file(dir_ / "run" / "fl-state.krab", dir_ / "round-3.krab");
  const Result six = fl_sim(sealed + " --set checkpoint.resume=true --set federated.rounds=6");
  ASSERT_EQ(six.code, 0) << six.output;
  EXPECT_NE(six.output.find("resumed"), std::string::npos) << six.output;

  fs::copy_file(dir_ / "round-3.krab", dir_ / "run" / "fl-state.krab",
                fs::copy_options::overwrite_existing);
  const std::string resume = sealed + " --set checkpoint.resume=true --set federated.rounds=9";
  Result r = fl_sim(resume);
  expect_refused(r, 2,
                 "run/fl-state.krab: replayed: 6 rounds of this run were released, this "
                 "file says 3");

  fs::remove(dir_ / "run" / "fl-state.krab");
  r = fl_sim(resume);
  expect_refused(r, 2, "6 rounds of this run were already released");
  EXPECT_NE(r.output.find("another name"), std::string::npos) << r.output;
  // Starting afresh on purpose, over the same run, is refused the same way; a new run is not.
  expect_refused(fl_sim(sealed), 2, "checkpoint.resume is false, but 6 rounds");
  EXPECT_EQ(fl_sim(sealed + " --set checkpoint.dir=run2").code, 0);
}

// A sealed file is bound to the run that wrote it: moved into another run's directory (with
// the same key, model and data) it is refused there, for fl-state.krab and for state.krab.
TEST_F(StateFiles, ASealedFileFromAnotherRunIsRefused) {
  write("fl.yaml", kFlJob);
  write("job.yaml", kTrainJob);
  const std::string sealed = " --set checkpoint.hmac_key_file=" + key();
  ASSERT_EQ(fl_sim(sealed + " --set checkpoint.dir=a").code, 0);
  fs::create_directories(dir_ / "b");
  fs::copy_file(dir_ / "a" / "fl-state.krab", dir_ / "b" / "fl-state.krab");
  expect_refused(fl_sim(sealed + " --set checkpoint.dir=b --set checkpoint.resume=true"), 2,
                 "fails its seal");

  ASSERT_EQ(run(krab("train job.yaml --set checkpoint.dir=ta" + sealed), 120).code, 0);
  fs::copy(dir_ / "ta", dir_ / "tb", fs::copy_options::recursive);
  const Result r = run(krab("train job.yaml --set checkpoint.dir=tb --set checkpoint.resume=true "
                            "--set train.steps=6" +
                            sealed),
                       120);
  expect_refused(r, 2, "fails its seal");
  // In its own run the same file resumes.
  const Result own = run(krab("train job.yaml --set checkpoint.dir=ta --set checkpoint.resume=true "
                              "--set train.steps=6" +
                              sealed),
                         120);
  EXPECT_EQ(own.code, 0) << own.output;
  EXPECT_NE(own.output.find("resumed from"), std::string::npos) << own.output;
}

}  // namespace
}  // namespace krab::cli_test
