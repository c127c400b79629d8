// End-to-end: the command line's rough edges of issue 25 (item 4): parse errors in krab's
// words, which worker count wins, paths that are not UTF-8, relative paths anchored to the job
// file, and one "final loss" everywhere.
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "core/errors.h"

namespace {

using namespace krab::cli_test;
using krab::str_cat;

// Exit 2 and exactly one line, krab's: "krab: error: <what>".
void expect_one_error_line(const Result& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output, "krab: error: " + what + "\n");
}

TEST_F(Cli, ParseErrorsAreKrabErrorsAndUnknownOptionsGetTheNearestOne) {
  write("ok.yaml", kSmallJob);
  expect_one_error_line(run(krab("train ok.yaml --reprot x.json")),
                        "unknown option '--reprot' of 'krab train'; did you mean '--report'?");
  expect_one_error_line(run(krab("train ok.yaml --reprot=x.json")),
                        "unknown option '--reprot' of 'krab train'; did you mean '--report'?");
  expect_one_error_line(run(krab("train ok.yaml --nproc 2")),
                        "unknown option '--nproc' of 'krab train'; did you mean "
                        "'--nproc-per-node'?");
  // Suggested from the options of the command given, not from another command's.
  expect_one_error_line(run(krab("fl-client --server h:1 --ca ca.pem --tokn-file t")),
                        "unknown option '--tokn-file' of 'krab fl-client'; did you mean "
                        "'--token-file'?");
  expect_one_error_line(run(krab("--verison")),
                        "unknown option '--verison' of 'krab'; did you mean '--version'?");
  expect_one_error_line(run(krab("train ok.yaml --frobnicate")),
                        "unknown option '--frobnicate' of 'krab train' (`krab train --help` "
                        "lists its options)");
  expect_one_error_line(run(krab("train ok.yaml --nproc-per-node 0")),
                        "--nproc-per-node: must be a whole number >= 1, got '0'");
  expect_one_error_line(run(krab("train")),
                        "job is required (`krab train --help` lists the arguments)");
  // --help still prints the help, with exit 0.
  const Result help = run(krab("train --help"));
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_NE(help.output.find("--nproc-per-node"), std::string::npos) << help.output;
}

// --nproc-per-node wins over the job's parallel.workers, as torchrun's flag does, and says so.
TEST_F(Cli, NprocPerNodeWinsOverParallelWorkersAndSaysSo) {
  write("ok.yaml", kSmallJob);  // parallel.workers: 2
  const Result r =
      run(krab("train ok.yaml --nproc-per-node 1 --set train.steps=2 --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("krab: note: --nproc-per-node 1 gives 1 worker(s), not the job's "
                          "parallel.workers: 2 (the command line wins)"),
            std::string::npos)
      << r.output;
  const auto j = nlohmann::json::parse(krab::core::read_file((dir_ / "r.json").string()));
  EXPECT_EQ(j["workers"], 1);
  // Agreeing values (or no flag) say nothing.
  const Result same = run(krab("train ok.yaml --nproc-per-node 2 --set train.steps=2"));
  ASSERT_EQ(same.code, 0) << same.output;
  EXPECT_EQ(same.output.find("note: --nproc-per-node"), std::string::npos) << same.output;
}

// Two columns and a class: enough for the csv reader and an mlp.
std::string small_csv() {
  std::string text = "a,b,label\n";
  for (int i = 0; i < 240; ++i) {
    const double a = (i * 37 % 101) / 101.0, b = (i * 53 % 97) / 97.0;
    text += str_cat(a, ",", b, ",", a > b ? 1 : 0, "\n");
  }
  return text;
}

// Linux allows any bytes but '/' and NUL in a file name: a folder named in Latin-1 ("café" as
// the byte 0xE9) holds the data, the run directory and the report. Messages escape the bytes;
// the report stays valid JSON.
TEST_F(Cli, PathsThatAreNotUtf8AreAccepted) {
  const std::string latin1 = "caf\xE9";
  fs::create_directories(dir_ / latin1);
  write(latin1 + "/d.csv", small_csv());
  write("job.yaml",
        "model: {name: mlp, hidden: 8}\n"
        "data: {name: csv, path: '" +
            latin1 +
            "/d.csv', batch_size: 16}\n"
            "train: {steps: 3}\nparallel: {workers: 1}\n"
            "checkpoint: {dir: '" +
            latin1 + "/run'}\n");
  const Result r = run(krab("train job.yaml --report '" + latin1 + "/r.json'"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / latin1 / "run" / "model.pt"));
  const auto j = nlohmann::json::parse(krab::core::read_file((dir_ / latin1 / "r.json").string()));
  EXPECT_EQ(j["workers"], 1);
  // --set takes them too; a missing one is named with its bytes escaped, ESC included.
  const Result missing = run(krab("train job.yaml --set 'data.path=caf\xE9\x1b/none.csv'"));
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("caf\\xe9\\x1b/none.csv' does not exist"), std::string::npos)
      << missing.output;
  EXPECT_EQ(missing.output.find('\x1b'), std::string::npos) << missing.output;
}

// A job file's relative paths are relative to its folder, wherever krab is started from, as
// in Compose and Kubernetes files; --set's are relative to the current directory; a missing
// file is named by its absolute path.
TEST_F(Cli, RelativePathsInAJobAreRelativeToItsFolder) {
  fs::create_directories(dir_ / "jobs");
  write("jobs/d.csv", small_csv());
  write("jobs/job.yaml",
        "model: {name: mlp, hidden: 8}\ndata: {name: csv, path: d.csv, batch_size: 16}\n"
        "train: {steps: 3}\nparallel: {workers: 1}\ncheckpoint: {dir: out}\n");
  const Result r = run(krab("train jobs/job.yaml --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "jobs" / "out" / "model.pt"));
  const auto j = nlohmann::json::parse(krab::core::read_file((dir_ / "r.json").string()));
  EXPECT_EQ(j["config"]["data"]["path"], (dir_ / "jobs" / "d.csv").string());
  // The same job from its own folder does the same.
  const Result inside = run("cd " + (dir_ / "jobs").string() + " && " + kKrab +
                            " train job.yaml --set checkpoint.dir=out2");
  ASSERT_EQ(inside.code, 0) << inside.output;
  EXPECT_TRUE(fs::exists(dir_ / "jobs" / "out2" / "model.pt"));
  // --set: from the current directory.
  ASSERT_EQ(run(krab("train jobs/job.yaml --set checkpoint.dir=here")).code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "here" / "model.pt"));
  expect_refused(run(krab("train jobs/job.yaml --set data.path=jobs/none.csv")), 2,
                 "CSV file '" + (dir_ / "jobs" / "none.csv").string() + "' does not exist");
  write("jobs/missing.yaml", "data: {name: csv, path: gone.csv}\n");
  expect_refused(run(krab("train jobs/missing.yaml")), 2,
                 "CSV file '" + (dir_ / "jobs" / "gone.csv").string() + "' does not exist");
}

// One "final loss": the last step's mean loss over the whole global batch. Three workers of 15
// examples see the global batch one worker of 45 sees, so both runs end at the same loss (to
// the all-reduce's rounding); the bar, the step line, the summary and the report say it alike.
TEST_F(Cli, OneFinalLossEverywhere) {
  write("d.csv", small_csv());
  write("job.yaml",
        "model: {name: mlp, hidden: 8}\ndata: {name: csv, path: d.csv, batch_size: 15}\n"
        "train: {steps: 12, log_every: 4, optimizer: {name: sgd, lr: 0.5}}\n"
        "parallel: {workers: 3}\n");
  const Result three = run(krab("train job.yaml --report three.json"));
  ASSERT_EQ(three.code, 0) << three.output;
  const Result one =
      run(krab("train job.yaml --report one.json --set checkpoint.dir=one "
               "--set parallel.workers=1 --set data.batch_size=45"));
  ASSERT_EQ(one.code, 0) << one.output;
  const auto r3 = nlohmann::json::parse(krab::core::read_file((dir_ / "three.json").string()));
  const auto r1 = nlohmann::json::parse(krab::core::read_file((dir_ / "one.json").string()));
  const double loss = r3["final_loss"].get<double>();
  EXPECT_NEAR(loss, r1["final_loss"].get<double>(), 1e-5);
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", loss);
  const std::string shown = text;
  for (const std::string& line :
       {str_cat("krab: step 12 loss ", shown, "\n"), str_cat("12/12 | loss ", shown, " | "),
        str_cat(", final loss ", shown, ", ")})
    EXPECT_NE(three.output.find(line), std::string::npos) << line << "\n" << three.output;
}

}  // namespace
