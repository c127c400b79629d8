// train::preflight without building a model larger than kWholeModelLimit: a 1.6 B-parameter
// gpt (6.4 GB of fp32 weights) passes the launcher's checks with a peak resident memory far
// below its weights; data the model cannot take is refused for a huge mlp with the very line a
// small mlp gets; and the disk offload room of a 1 T-parameter gpt (which no machine could
// build) is computed from its description and refused in the closed form's bytes, at stage 3 with
// the master shards counted.
#include "train/preflight.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/errors.h"
#include "core/fs.h"
#include "models/describe.h"
#include "models/forward_error.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/manifest.h"
#include "train/memory_report.h"
#include "train/optimizer_state.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

class PreflightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("krab_preflight_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "corpus.txt") << std::string(600, 'a') + "bcdefgh";
  }
  void TearDown() override { fs::remove_all(dir_); }

  core::Config gpt(int64_t layers, int64_t width, const std::string& more = "") const {
    return core::Config::parse(str_cat("model: {name: gpt, layers: ", layers, ", width: ", width,
                                       ", heads: 4, context: 16}\n"
                                       "data: {name: text, path: '",
                                       (dir_ / "corpus.txt").string(),
                                       "', batch_size: 2}\n"
                                       "checkpoint: {dir: '",
                                       (dir_ / "runs").string(), "'}\n", more),
                               "gpt.yaml");
  }

  // 1.03 T parameters on 4 ranks with Adam: every unit's numel is a multiple of 4 · 16 and of
  // 512, so each rank's file is `fields` · 4 bytes · Ψ / 4 = `fields` · Ψ bytes, no padding,
  // every region a whole number of pages. The launcher refuses it naming both numbers, and no
  // file is made.
  void expect_offload_room_refused(int stage, int64_t fields) const {
    const int64_t layers = 20, w = 65536;
    const core::Config c = gpt(layers, w,
                               str_cat("parallel: {zero_stage: ", stage,
                                       ", offload: disk}\ntrain: {optimizer: {name: adam}}\n"));
    std::string what;
    try {
      preflight(c, 4);
    } catch (const InvalidArgument& e) {
      what = e.what();
    }
    const int64_t vocab = model_spec(c, load_data(c)).num_classes, context = 16;
    const int64_t psi = layers * (12 * w * w + 13 * w) + w * (2 * vocab + context + 2);
    const std::string dir = (dir_ / "runs" / "offload").string();
    EXPECT_NE(
        what.find(str_cat("parallel.offload: disk needs ",
                          static_cast<int64_t>(std::ceil(4.0 * (fields * psi) * 1.05)),
                          " bytes in '", dir, "' (4 ranks x ", fields * psi, " bytes, + 5%)")),
        std::string::npos)
        << what;
    EXPECT_FALSE(fs::exists(dir_ / "runs" / "offload" / "rank-0.bin"));
  }

  fs::path dir_;
};

// Resident bytes of this process now (VmRSS).
int64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false where /proc does not allow it.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

TEST_F(PreflightTest, AGptOf1point6BillionParametersIsNotBuilt) {
  const int64_t layers = 8, w = 4096;
  const core::Config c = gpt(layers, w);
  const int64_t blocks = layers * (12 * w * w + 13 * w);
  const bool reset = reset_peak_rss();
  const int64_t before = reset ? rss_bytes() : 0;
  ::testing::internal::CaptureStderr();
  const PreflightInfo info = preflight(c, 4);
  const std::string said = ::testing::internal::GetCapturedStderr();
  const int64_t peak = peak_rss_bytes();
  ASSERT_GT(peak, 0);
  EXPECT_GT(info.parameters, blocks);  // + embeddings, ln_f and head
  const int64_t vocab = model_spec(c, load_data(c)).num_classes;
  EXPECT_EQ(info.parameters, blocks + w * (2 * vocab + 16 + 2));  // tok, head, pos, ln_f
  RecordProperty("peak_growth_bytes", std::to_string(peak - before));
  const int64_t weights = 4 * info.parameters;  // 6.4 GB, 12.8 GB with the dry run's grads
  // Where clear_refs is not allowed, the process's whole peak (this test executable's small
  // tests ran before) still has to stay far below.
  EXPECT_LT(peak - before, weights / 32)
      << "peak " << peak << " before " << before << " weights " << weights;
  EXPECT_NE(said.find("krab: the launcher does not build a gpt of 1.6 B parameters, more than "
                      "33.6 M: it tried the data on a gpt of 1 block of width 4"),
            std::string::npos)
      << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
}

// {"x": 16 x 8 float64, "y": 16 labels in [0, 4)}, as torch.save writes it.
void write_float64_data(const fs::path& path) {
  c10::Dict<std::string, at::Tensor> xy;
  xy.insert("x", torch::rand({16, 8}, torch::kFloat64));
  xy.insert("y", torch::arange(16, torch::kInt64).remainder(4));
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(xy));
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string refusal(const core::Config& c) {
  try {
    preflight(c, 2);
  } catch (const models::ForwardError& e) {
    return e.what();
  }
  return "(no ForwardError)";
}

TEST_F(PreflightTest, AHugeMlpOnFloat64DataIsRefusedWithTheSmallMlpsLine) {
  write_float64_data(dir_ / "train64.pt");
  const auto job = [&](int64_t hidden) {
    return core::Config::parse(
        str_cat("model: {name: mlp, hidden: ", hidden, "}\ndata: {name: tensors, path: '",
                (dir_ / "train64.pt").string(), "', batch_size: 2}\n"),
        "mlp.yaml");
  };
  const std::string small = refusal(job(128));
  EXPECT_NE(small.find("the data's inputs are torch.float64, the model's parameters "
                       "torch.float32"),
            std::string::npos)
      << small;
  ::testing::internal::CaptureStderr();
  const std::string huge = refusal(job(40000));  // 1.6 B parameters: the reduced mlp runs
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(huge, small);
  EXPECT_NE(said.find("an mlp of hidden width 8"), std::string::npos) << said;
}

// Stage 2: Adam's exp_avg and exp_avg_sq, 2Ψ per rank.
TEST_F(PreflightTest, DiskOffloadRoomOfAModelNoMachineCouldBuildIsRefusedBeforeAnyWorker) {
  expect_offload_room_refused(2, 2);
}

// Stage 3 keeps its fp32 master shards in the offload file beside the optimizer state: the same
// model needs 3Ψ per rank with Adam (master, exp_avg, exp_avg_sq).
TEST_F(PreflightTest, DiskOffloadRoomAtStageThreeCountsTheMasterShards) {
  expect_offload_room_refused(3, 3);
}

std::string refused(const core::Config& c) {
  try {
    preflight(c, 4);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(nothing refused)";
}

// A sharded checkpoint of the 1.6 B gpt at step 5 (its manifest only: the launcher reads no
// shard of a model it does not build), written by an Adam job of global batch 8.
void write_manifest_of(const core::Config& c, const fs::path& run_dir) {
  const models::ModelSpec spec = model_spec(c, load_data(c));
  engine::UnitParams root;
  std::string signature;
  for (const models::ParameterShape& p : models::describe_parameters(spec).params) {
    root.params.push_back({p.name, p.shape});
    signature += str_cat(p.name, ":", at::IntArrayRef(p.shape), ";");
  }
  Manifest m;
  m.meta = {5, "gpt", signature, 8, c.get_int("train.seed")};
  m.checkpoint_id = std::string(32, 'a');
  m.stage = 2;
  m.layout = engine::plan_layout({root}, 4, 16);
  m.optimizer_type = "adam";
  m.optimizer_options = group_options(*make_optimizer(c, {torch::zeros({1})}));
  m.shards.assign(4, ShardDigest{1, std::string(64, '0')});
  core::RecordWriter rec;
  write_manifest(m, rec);
  const fs::path step = run_dir / step_dir_name(5);
  fs::create_directories(step);
  core::write_file_atomic(manifest_path(step.string()), frame_checkpoint(rec.bytes()));
  publish_step(run_dir.string(), 5, 2);
}

// Resuming a model the launcher does not build: the manifest is checked against the job (its
// global batch, its optimizer); the shards are the workers' to verify.
TEST_F(PreflightTest, AHugeModelsShardedCheckpointIsCheckedByItsManifest) {
  core::Config c = gpt(8, 4096, "train: {optimizer: {name: adam}}\n");
  c.set("checkpoint.resume", "true");
  write_manifest_of(c, dir_ / "runs");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(refused(c), "(nothing refused)");  // the shards are missing: the workers say so
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("the workers verify the checkpoint's files"), std::string::npos) << said;
  core::Config other = c;
  other.set("train.optimizer.name", "sgd");
  EXPECT_NE(refused(other).find("holds the state of optimizer 'adam'; this job's "
                                "train.optimizer.name is 'sgd'"),
            std::string::npos)
      << refused(other);
  other = c;
  other.set("data.batch_size", "1");  // global batch 4, not 8
  EXPECT_NE(refused(other).find("manifest.krab"), std::string::npos) << refused(other);
  other = c;
  other.set("model.heads", "8");  // the same parameters, another model: not refused by shapes
  EXPECT_EQ(refused(other), "(nothing refused)");
  other = c;
  other.set("model.layers", "7");
  EXPECT_NE(refused(other).find("manifest.krab"), std::string::npos) << refused(other);
}

}  // namespace
}  // namespace krab::train
