// Checkpoint files and the `latest` pointer given bytes krab did not write: regression tests
// for what tests/fuzz/ found (docs/fuzzing.md). Every refusal is a krab error naming the file,
// with the file's bytes escaped in the message.
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

struct RunDir {
  fs::path path = fs::temp_directory_path() / ("krab-ckpt-test-" + std::to_string(::getpid()));
  RunDir() { fs::create_directories(path / "step-00000001"); }
  ~RunDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path / name, std::ios::binary | std::ios::trunc) << bytes;
  }
};

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CorruptData& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected CorruptData";
  return "";
}

TEST(LatestPointer, ANulAndGarbageAfterAValidNameIsRefusedAndEscaped) {
  RunDir run;
  run.write("step-00000001/state.krab", "x");
  run.write("latest", std::string("step-00000001\0garbage\n", 22));
  const std::string msg = message_of([&] { latest_checkpoint(run.path.string()); });
  EXPECT_NE(msg.find("does not name a step directory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step-00000001\\x00garbage"), std::string::npos) << msg;
}

TEST(LatestPointer, OnlyStepAndDigitsNameAStep) {
  RunDir run;
  run.write("step-00000001/state.krab", "x");
  for (const std::string bad : {"step-", "step-1x", "step-00000001/..", "step-\x1b[2J"}) {
    run.write("latest", bad);
    const std::string msg = message_of([&] { latest_checkpoint(run.path.string()); });
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << "raw escape byte in: " << msg;
  }
  run.write("latest", "step-00000001\r\n");
  EXPECT_EQ(latest_checkpoint(run.path.string()),
            (run.path / "step-00000001" / "state.krab").string());
}

// A checkpoint file around `payload` with a valid header, as a buggy writer or a forger makes.
std::string with_header(const std::string& payload) {
  std::string out("KRABCKPT", 8);
  const uint32_t version = 1;
  const uint64_t length = payload.size();
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out + payload;
}

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

struct Job {
  torch::nn::Linear model{torch::nn::LinearOptions(3, 2)};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1)};
  CheckpointMeta expect;
  Job() {
    expect.model_name = "linear";
    expect.signature = model_signature(*model);
    expect.global_batch = 8;
  }
  void write_meta(torch::serialize::OutputArchive& a) const {
    a.write("meta.step", c10::IValue(int64_t{3}));
    a.write("meta.model_name", c10::IValue(expect.model_name));
    a.write("meta.signature", c10::IValue(expect.signature));
    a.write("meta.global_batch", c10::IValue(expect.global_batch));
    a.write("meta.seed", c10::IValue(int64_t{0}));
  }
};

TEST(Checkpoint, AMissingOrMistypedEntryBehindAValidCrcIsCorruptDataNamingTheFile) {
  Job job;
  torch::serialize::OutputArchive missing;  // no meta.step at all
  missing.write("meta.model_name", c10::IValue(std::string("linear")));
  std::string msg = message_of([&] {
    decode_checkpoint(with_header(archive_bytes(missing)), "run/state.krab", job.expect, *job.model,
                      job.optimizer);
  });
  EXPECT_NE(msg.find("run/state.krab"), std::string::npos) << msg;

  torch::serialize::OutputArchive mistyped;  // meta.step is a string
  mistyped.write("meta.step", c10::IValue(std::string("three")));
  mistyped.write("meta.model_name", c10::IValue(job.expect.model_name));
  msg = message_of([&] {
    decode_checkpoint(with_header(archive_bytes(mistyped)), "run/state.krab", job.expect,
                      *job.model, job.optimizer);
  });
  EXPECT_NE(msg.find("run/state.krab"), std::string::npos) << msg;
}

TEST(Checkpoint, ATensorThatContradictsTheSignatureIsRefusedAndNothingIsLoaded) {
  Job job;
  const at::Tensor before = job.model->weight.detach().clone();
  torch::serialize::OutputArchive a;
  job.write_meta(a);
  // The signature says [2, 3]; a [1] tensor would broadcast into it if it were copied unchecked.
  a.write("param.weight", torch::full({1}, 7.f));
  a.write("param.bias", torch::zeros({2}));
  const std::string msg = message_of([&] {
    decode_checkpoint(with_header(archive_bytes(a)), "run/state.krab", job.expect, *job.model,
                      job.optimizer);
  });
  EXPECT_NE(msg.find("param.weight"), std::string::npos) << msg;
  EXPECT_TRUE(torch::equal(job.model->weight, before));
}

}  // namespace
}  // namespace krab::train
