// One forward and backward of the job's model on its first examples, run before any worker,
// round or progress bar starts (train/dry_run.h), as a user meets it: the `krab` binary on files
// that Python's torch.jit.script and torch.save wrote. A model that cannot take the data ends in
// exit 2 and one line naming the model, the data file and the dtypes or shapes; no traceback on
// the terminal (it is in a file the line names, or after the line with --verbose), no worker.
#include <algorithm>

#include "cli/cli_support.h"

namespace krab::cli_test {
namespace {

class ForwardDryRun : public Cli {
 protected:
  // The files of write_forward_cases.py, written once for the suite and copied into each test.
  static void SetUpTestSuite() {
    cases_ = fs::temp_directory_path() / ("krab-forward-cases-" + std::to_string(::getpid()));
    fs::create_directories(cases_);
    const auto made = run(std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR +
                          "/tests/train/write_forward_cases.py " + cases_.string());
    ASSERT_EQ(made.code, 0) << made.output;
  }
  static void TearDownTestSuite() { fs::remove_all(cases_); }
  void SetUp() override {
    Cli::SetUp();
    for (const auto& f : fs::directory_iterator(cases_))
      fs::copy_file(f.path(), dir_ / f.path().filename());
    write("job.yaml", R"(
model: {name: torchscript, path: net.pt}
data: {name: tensors, path: train.pt, batch_size: 8}
train: {steps: 4, optimizer: {name: sgd, lr: 0.05}}
parallel: {workers: 2}
comm: {timeout_s: 20}
federated: {clients: 2, rounds: 2}
)");
  }
  // krab with its temporary files (the traceback's) in the test's directory.
  std::string krab_here(const std::string& args) {
    return "cd " + dir_.string() + " && TMPDIR=. " + kKrab + " " + args;
  }

  // Exit 2 and one line, `line` up to its end or to the traceback file's name; nothing else on
  // the terminal (no traceback, no worker's line, no "krab: JOB — 2 worker(s)" said before
  // spawning), and no run directory. Returns the traceback file's path ("" when none).
  std::string expect_one_line(const Result& r, const std::string& line) {
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_EQ(r.output.rfind("krab: error: " + line, 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("[rank"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "runs"));
    const std::string mark = " (traceback in ";
    const size_t at = r.output.find(mark);
    if (at == std::string::npos) return "";
    const size_t end = r.output.find(';', at);
    return r.output.substr(at + mark.size(), end - at - mark.size());
  }
  // A file of the test's directory as the error names it: relative paths in a job resolve
  // against the job file's folder.
  std::string at(const std::string& name) const { return (dir_ / name).string(); }
  static fs::path cases_;
};

fs::path ForwardDryRun::cases_;

const char* kFloat64 =
    "mat1 and mat2 must have the same dtype: the data's inputs are torch.float64, the model's "
    "parameters torch.float32 (save the inputs as torch.float32, e.g. x.float())";

TEST_F(ForwardDryRun, Float64DataIntoAFloat32ModelIsNamedBeforeAnyWorker) {
  const auto r = run(krab_here("train job.yaml --set data.path=train64.pt"));
  const std::string file = expect_one_line(
      r, "model.path '" + at("net.pt") + "': forward on the first 2 examples of data.path '" +
             at("train64.pt") + "' failed: " + kFloat64 + " (traceback in ./krab-forward-");
  // The traceback is in the file the line names: LibTorch's own text, whole.
  ASSERT_FALSE(file.empty()) << r.output;
  const std::string traceback = core::read_file((dir_ / file).string());
  EXPECT_NE(traceback.find("Traceback of TorchScript"), std::string::npos) << traceback;
  EXPECT_NE(traceback.find("RuntimeError: mat1 and mat2 must have the same dtype"),
            std::string::npos)
      << traceback;
}

TEST_F(ForwardDryRun, ALinearLayerOfAnotherInputSizeIsNamedWithBothSizes) {
  const std::string line =
      "model.path '" + at("wide.pt") + "': forward on the first 2 examples of data.path '" +
      at("train.pt") +
      "' failed: mat1 and mat2 shapes cannot be multiplied (2x8 and 100x4): a Linear layer expects "
      "100 "
      "input features but gets 8, the 8 values of one example of the data [8] (traceback in ";
  expect_one_line(run(krab_here("train job.yaml --set model.path=wide.pt")), line);
  // The parameter-server mode's launcher runs the same check before its servers start.
  expect_one_line(run(krab_here("train job.yaml --set model.path=wide.pt --set sync.mode=async "
                                "--set sync.servers=1")),
                  line);
}

TEST_F(ForwardDryRun, TheBuiltInMlpOnFloat64DataIsNamedBeforeAnyWorker) {
  const auto r = run(krab_here("train job.yaml --set model.name=mlp --set data.path=train64.pt"));
  expect_one_line(r, "model.name 'mlp': forward on the first 2 examples of data.path '" +
                         at("train64.pt") + "' failed: " + kFloat64);
}

// A Python exception the module raises is the line LibTorch ends with, class included.
TEST_F(ForwardDryRun, AnExceptionTheModuleRaisesIsNamedWithItsClass) {
  expect_one_line(run(krab_here("train job.yaml --set model.path=raises.pt")),
                  "model.path '" + at("raises.pt") +
                      "': forward on the first 2 examples of data.path '" + at("train.pt") +
                      "' failed: ValueError: x must be one-dimensional (traceback in ");
}

// The loss of the same dry run: cross_entropy wants one class index per example.
TEST_F(ForwardDryRun, LabelsThatDoNotFitTheLossAreNamedWithBothShapes) {
  const auto r = run(krab_here("train job.yaml --set model.name=mlp --set data.path=pairs.pt"));
  expect_one_line(r,
                  "model.name 'mlp': train.loss cross_entropy of outputs [2, 4] torch.float32 "
                  "against labels [2, 2] torch.int64 on the first 2 examples of data.path '" +
                      at("pairs.pt") + "' failed: ");
}

TEST_F(ForwardDryRun, VerbosePrintsTheTracebackAfterTheLine) {
  const auto r = run(krab_here("train job.yaml --set data.path=train64.pt --verbose"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(
      r.output.rfind(
          "krab: error: model.path '" + at("net.pt") + "': forward on the first 2 examples", 0),
      0u)
      << r.output;
  EXPECT_NE(r.output.find("\nThe following operation failed in the TorchScript interpreter."),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("Traceback of TorchScript"), std::string::npos) << r.output;
}

// fl-sim holds the model and the data in its own process: the same check, before round 1.
TEST_F(ForwardDryRun, FlSimNamesItBeforeTheFirstRound) {
  const auto r = run(krab_here("fl-sim job.yaml --set data.path=train64.pt"));
  expect_one_line(r, "model.path '" + at("net.pt") +
                         "': forward on the first 2 examples of data.path '" + at("train64.pt") +
                         "' failed: " + kFloat64);
}

}  // namespace
}  // namespace krab::cli_test
