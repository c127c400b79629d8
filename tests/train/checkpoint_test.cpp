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
#include <functional>
#include <memory>

#include "core/errors.h"
#include "core/record.h"
#include "train/optimizer_state.h"

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
std::string with_header(const std::string& payload, uint32_t version = 2) {
  std::string out("KRABCKPT", 8);
  const uint64_t length = payload.size();
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out + payload;
}

struct Job {
  torch::nn::Linear model{torch::nn::LinearOptions(3, 2)};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  CheckpointMeta expect;
  Job() {
    expect.model_name = "linear";
    expect.signature = model_signature(*model);
    expect.global_batch = 8;
  }
  void write_meta(core::RecordWriter& r) const {
    r.add_int("meta.step", 3);
    r.add_string("meta.model_name", expect.model_name);
    r.add_string("meta.signature", expect.signature);
    r.add_int("meta.global_batch", expect.global_batch);
    r.add_int("meta.seed", 0);
  }
};

TEST(Checkpoint, AMissingOrMistypedEntryBehindAValidCrcIsCorruptDataNamingTheFile) {
  Job job;
  core::RecordWriter missing;  // no meta.step at all
  missing.add_string("meta.model_name", "linear");
  std::string msg = message_of([&] {
    decode_checkpoint(with_header(missing.bytes()), "run/state.krab", job.expect, *job.model,
                      job.optimizer);
  });
  EXPECT_NE(msg.find("run/state.krab"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'meta.step' is missing"), std::string::npos) << msg;

  core::RecordWriter mistyped;  // meta.step is a string
  mistyped.add_string("meta.step", "three");
  mistyped.add_string("meta.model_name", job.expect.model_name);
  msg = message_of([&] {
    decode_checkpoint(with_header(mistyped.bytes()), "run/state.krab", job.expect, *job.model,
                      job.optimizer);
  });
  EXPECT_NE(msg.find("run/state.krab"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is a string, not an integer"), std::string::npos) << msg;
}

TEST(Checkpoint, ATensorThatContradictsTheSignatureIsRefusedAndNothingIsLoaded) {
  Job job;
  const at::Tensor before = job.model->weight.detach().clone();
  core::RecordWriter a;
  job.write_meta(a);
  // The signature says [2, 3]; a [1] tensor would broadcast into it if it were copied unchecked.
  a.add_tensor("param.weight", torch::full({1}, 7.f));
  a.add_tensor("param.bias", torch::zeros({2}));
  const std::string msg = message_of([&] {
    decode_checkpoint(with_header(a.bytes()), "run/state.krab", job.expect, *job.model,
                      job.optimizer);
  });
  EXPECT_NE(msg.find("param.weight"), std::string::npos) << msg;
  EXPECT_TRUE(torch::equal(job.model->weight, before));
}

// Version 1 was a LibTorch (TorchScript) archive: parsing one ran the code in it. It is refused
// on its header alone, whatever follows, and the message says why and what to do.
TEST(Checkpoint, TheFirstFormatIsRefusedOnItsVersionSayingWhy) {
  Job job;
  for (const std::string payload : {std::string("PK\x03\x04 anything"), std::string()}) {
    const std::string msg = message_of([&] {
      decode_checkpoint(with_header(payload, 1), "run/state.krab", job.expect, *job.model,
                        job.optimizer);
    });
    EXPECT_NE(msg.find("run/state.krab"), std::string::npos) << msg;
    EXPECT_NE(msg.find("format version 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("could run code"), std::string::npos) << msg;
    EXPECT_NE(msg.find("start the run afresh"), std::string::npos) << msg;
  }
}

// Trains `steps` steps of a fixed problem with `opt` on `m`.
void train(torch::nn::Linear& m, torch::optim::Optimizer& opt, int steps) {
  const at::Tensor x = torch::linspace(-1, 1, 24).reshape({8, 3});
  const at::Tensor y = torch::cos(x.sum(1, true)).expand({8, 2}) * torch::tensor({1.f, -2.f});
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    torch::mse_loss(m(x), y).backward();
    opt.step();
  }
}

// For each optimizer krab builds: three steps, a checkpoint, three more steps, against a fresh
// model and optimizer that load the checkpoint and take the same three steps. Bit-identical, so
// every piece of optimizer state the next steps read (momentum, Adam's moments and step count,
// AMSGrad's maximum, the group options) came back.
TEST(Checkpoint, EveryOptimizerResumesBitIdentically) {
  using namespace torch::optim;
  using Make = std::function<std::unique_ptr<Optimizer>(std::vector<at::Tensor>)>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"sgd nesterov",
       [](auto p) {
         return std::make_unique<SGD>(
             p, SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3));
       }},
      {"adam", [](auto p) { return std::make_unique<Adam>(p, AdamOptions(0.01)); }},
      {"adamw amsgrad",
       [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions(0.01).amsgrad(true)); }},
  };
  for (const auto& [name, make] : makers) {
    torch::manual_seed(1);
    torch::nn::Linear a(torch::nn::LinearOptions(3, 2));
    auto opt_a = make(a->parameters());
    train(a, *opt_a, 3);
    CheckpointMeta meta{3, "linear", model_signature(*a), 8, 0};
    const std::string bytes = encode_checkpoint(meta, *a, *opt_a);
    train(a, *opt_a, 3);

    torch::manual_seed(2);  // other initial weights: they must all be overwritten
    torch::nn::Linear b(torch::nn::LinearOptions(3, 2));
    // Other options too: the saved ones replace them.
    auto opt_b = make(b->parameters());
    opt_b->param_groups()[0].options().set_lr(0.5);
    EXPECT_EQ(decode_checkpoint(bytes, "state.krab", meta, *b, *opt_b).step, 3) << name;
    train(b, *opt_b, 3);
    EXPECT_TRUE(torch::equal(a->weight, b->weight)) << name;
    EXPECT_TRUE(torch::equal(a->bias, b->bias)) << name;
  }
}

TEST(Checkpoint, AnotherOptimizerIsNotSupportedByNameAndAnotherTypeIsRefused) {
  torch::nn::Linear m(torch::nn::LinearOptions(3, 2));
  torch::optim::RMSprop rms(m->parameters(), torch::optim::RMSpropOptions(0.1));
  CheckpointMeta meta{0, "linear", model_signature(*m), 8, 0};
  try {
    encode_checkpoint(meta, *m, rms);
    ADD_FAILURE() << "RMSprop state was written";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("RMSprop"), std::string::npos) << e.what();
  }
  torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::Adam adam(m->parameters(), torch::optim::AdamOptions(0.1));
  const std::string bytes = encode_checkpoint(meta, *m, sgd);
  try {
    decode_checkpoint(bytes, "run/state.krab", meta, *m, adam);
    ADD_FAILURE() << "SGD state was loaded into Adam";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer 'sgd'"), std::string::npos) << e.what();
  }
}

// A momentum buffer of the wrong shape is found before anything is copied: the parameters, the
// optimizer and the generator stay as they were.
TEST(Checkpoint, ABadOptimizerEntryLeavesEverythingAsItWas) {
  Job job;
  train(job.model, job.optimizer, 1);
  const at::Tensor weight = job.model->weight.detach().clone();
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  core::RecordWriter a;
  job.write_meta(a);
  a.add_tensor("param.weight", torch::full({2, 3}, 7.f));
  a.add_tensor("param.bias", torch::zeros({2}));
  a.add_string("optimizer.type", "sgd");
  a.add_int("optimizer.groups", 1);
  a.add_int("optimizer.group.0.params", 2);
  for (const char* o : {"lr", "momentum", "dampening", "weight_decay", "nesterov"})
    a.add_double(std::string("optimizer.group.0.") + o, 0.5);
  a.add_tensor("optimizer.state.0.momentum_buffer", torch::zeros({3, 2}));
  a.add_tensor("rng", torch::zeros({5056}, torch::kByte));
  const std::string msg = message_of([&] {
    decode_checkpoint(with_header(a.bytes()), "run/state.krab", job.expect, *job.model,
                      job.optimizer);
  });
  EXPECT_NE(msg.find("optimizer.state.0.momentum_buffer"), std::string::npos) << msg;
  EXPECT_TRUE(torch::equal(job.model->weight, weight));
  EXPECT_EQ(job.optimizer.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng));
}

// A state made before training and living elsewhere (parallel.offload: a memory-mapped file;
// here a buffer of the test's) stays where it lives when a checkpoint is installed: the values
// are copied into its tensors, an absent field zeroes them and an absent step count is 0. With
// install_param_state's plain path the restored state would leave the file unnoticed: the
// numbers would be right and the memory not offloaded.
TEST(OptimizerStateInstall, CopiesIntoAStateThatLivesElsewhere) {
  std::vector<float> pinned(3 * 4, -1.0f);
  at::Tensor p = torch::zeros({4});
  torch::optim::Adam opt({p}, torch::optim::AdamOptions(0.1).amsgrad(true));
  auto st = std::make_unique<torch::optim::AdamParamState>();
  st->step(5);
  st->exp_avg(torch::from_blob(pinned.data(), {4}));
  st->exp_avg_sq(torch::from_blob(pinned.data() + 4, {4}));
  st->max_exp_avg_sq(torch::from_blob(pinned.data() + 8, {4}));
  const std::string id = c10::guts::to_string(p.unsafeGetTensorImpl());
  opt.state()[id] = std::move(st);

  ParamStateValues v;
  v.step = 7;
  v.fields["exp_avg"] = torch::arange(4, torch::kFloat);
  v.fields["exp_avg_sq"] = torch::arange(4, torch::kFloat) * 2;
  install_param_state(opt, p, v);
  auto& got = static_cast<torch::optim::AdamParamState&>(*opt.state().at(id));
  EXPECT_EQ(got.step(), 7);
  EXPECT_EQ(got.exp_avg().data_ptr(), static_cast<void*>(pinned.data()));
  EXPECT_EQ(got.exp_avg_sq().data_ptr(), static_cast<void*>(pinned.data() + 4));
  EXPECT_EQ(got.max_exp_avg_sq().data_ptr(), static_cast<void*>(pinned.data() + 8));
  EXPECT_EQ(std::vector<float>(pinned.begin(), pinned.end()),
            (std::vector<float>{0, 1, 2, 3, 0, 2, 4, 6, 0, 0, 0, 0}));

  install_param_state(opt, p, ParamStateValues{});  // a checkpoint without state: fresh
  EXPECT_EQ(static_cast<torch::optim::AdamParamState&>(*opt.state().at(id)).step(), 0);
  EXPECT_EQ(std::vector<float>(pinned.begin(), pinned.end()), std::vector<float>(12, 0.0f));
}

}  // namespace
}  // namespace krab::train
