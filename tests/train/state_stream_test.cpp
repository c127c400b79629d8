// state.krab streamed (train/checkpoint.h: write_checkpoint, save_checkpoint): the file's
// bytes are those of the in-memory encoder it replaced, byte for byte, sealed or not; a write
// that fails midway leaves the previous checkpoint in force; a run resumes from it as from the
// old file; and writing holds no copy of the state.
#include <gtest/gtest.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <functional>
#include <memory>

#include "core/errors.h"
#include "core/fs.h"
#include "core/record.h"
#include "core/seal.h"
#include "train/checkpoint.h"
#include "train/optimizer_state.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

struct TempRun {
  fs::path path = fs::temp_directory_path() / ("krab-state-stream-" + std::to_string(::getpid()));
  TempRun() { fs::create_directories(path); }
  ~TempRun() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// A model with parameters and buffers (batch norm's running statistics and its int64 count)
// and an optimizer that has stepped, so that every kind of entry is in the file.
struct Net {
  torch::nn::Sequential net{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt;

  Net(uint64_t seed, const std::string& optimizer) {
    torch::manual_seed(seed);
    net = torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::BatchNorm1d(16),
                                torch::nn::Functional(torch::relu), torch::nn::Linear(16, 3));
    if (optimizer == "adam")
      opt =
          std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
    else
      opt = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  void train(int steps) {
    const at::Tensor x = torch::linspace(-1, 1, 48).reshape({8, 6});
    const at::Tensor y = torch::sin(x.narrow(1, 0, 3) * 2);
    for (int i = 0; i < steps; ++i) {
      opt->zero_grad();
      torch::mse_loss(net->forward(x), y).backward();
      opt->step();
    }
  }
  CheckpointMeta meta(int64_t step) const { return {step, "seq", model_signature(*net), 8, 7}; }
};

// What krab wrote before state.krab was streamed, rebuilt from the old pieces: the whole record
// in memory (core::RecordWriter), a frame made here with zlib's CRC-32, and core::seal.
std::string old_encoding(const CheckpointMeta& meta, torch::nn::Module& module,
                         torch::optim::Optimizer& optimizer, const std::string& key,
                         const std::string& job) {
  core::RecordWriter record;
  write_meta(meta, record);
  for (const auto& item : module.named_parameters())
    record.add_tensor("param." + item.key(), item.value());
  for (const auto& item : module.named_buffers())
    record.add_tensor("buffer." + item.key(), item.value());
  write_optimizer_state(optimizer, record);
  record.add_tensor("rng", at::detail::getDefaultCPUGenerator().get_state());
  const std::string payload = record.bytes();
  std::string out("KRABCKPT", 8);
  const uint32_t version = 2;
  const uint64_t length = payload.size();
  const auto crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return core::seal(out + payload, key, job);
}

const std::string kKey(32, 'k');

TEST(StateStream, TheStreamedFileIsTheOldEncodingByteForByte) {
  for (const std::string optimizer : {"adam", "sgd"}) {
    for (const std::string& key : {std::string(), kKey}) {
      SCOPED_TRACE(optimizer + (key.empty() ? ", unsealed" : ", sealed"));
      TempRun run;
      Net n(1, optimizer);
      n.train(3);
      const std::string job = checkpoint_job(run.str(), n.meta(3).signature);
      const std::string want = old_encoding(n.meta(3), *n.net, *n.opt, key, job);
      const std::string path = save_checkpoint(run.str(), n.meta(3), *n.net, *n.opt, key, job, 2);
      EXPECT_EQ(path, (run.path / "step-00000003" / "state.krab").string());
      const std::string got = core::read_file(path);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_TRUE(got == want);
      EXPECT_EQ(core::read_file((run.path / "latest").string()), "step-00000003\n");
      if (key.empty()) EXPECT_TRUE(encode_checkpoint(n.meta(3), *n.net, *n.opt) == want);
    }
  }
}

// The streamed writer with a sink that fails (a full disk) fails with the sink's error.
TEST(StateStream, ASinkFailureComesOutAsTheSinksError) {
  struct Full : core::ByteSink {
    size_t room = 1000;
    void write(const char*, size_t n) override {
      if (n > room) throw Error("state.krab: No space left on device");
      room -= n;
    }
    using core::ByteSink::write;
  } full;
  Net n(1, "adam");
  n.train(1);
  core::RecordStreamWriter record;
  write_state_entries(n.meta(1), *n.net, *n.opt, record);
  ASSERT_GT(record.size(), full.room);
  try {
    write_checkpoint(full, record, kKey, "job");
    ADD_FAILURE() << "wrote past the sink's room";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
  }
}

// A write that fails midway (here under a file-size limit, EFBIG) is an error naming the file;
// no state.krab and no temporary are left, `latest` still names the previous checkpoint and
// that checkpoint still loads.
TEST(StateStream, AWriteThatFailsMidwayLeavesThePreviousCheckpointInForce) {
  TempRun run;
  Net n(1, "adam");
  n.train(1);
  save_checkpoint(run.str(), n.meta(1), *n.net, *n.opt, "", "", 3);
  n.train(1);
  const size_t size = encode_checkpoint(n.meta(2), *n.net, *n.opt).size();
  ASSERT_GT(size, 4096u);  // the limit below cuts the write midway
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 2048;
  ::setrlimit(RLIMIT_FSIZE, &small);
  std::string error;
  try {
    save_checkpoint(run.str(), n.meta(2), *n.net, *n.opt, "", "", 3);
  } catch (const Error& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  const fs::path failed = run.path / "step-00000002";
  EXPECT_NE(error.find((failed / "state.krab").string()), std::string::npos) << error;
  EXPECT_TRUE(fs::is_empty(failed)) << "a state.krab or a temporary was left behind";
  EXPECT_EQ(core::read_file((run.path / "latest").string()), "step-00000001\n");
  const auto state = latest_checkpoint(run.str());
  ASSERT_TRUE(state.has_value());
  Net m(2, "adam");
  EXPECT_EQ(
      decode_checkpoint(read_checkpoint_file(*state, "", ""), *state, n.meta(1), *m.net, *m.opt)
          .step,
      1);
}

// Three steps, a checkpoint written by each encoder, then a fresh model and optimizer resume
// from each (both readers: the whole-file read of the stage-0 resume and the in-place index of
// the resharding reader) and take three more steps: all end bit-identical to the run that did
// not stop.
TEST(StateStream, ResumingFromTheStreamedFileEqualsResumingFromTheOldOne) {
  for (const std::string optimizer : {"adam", "sgd"}) {
    SCOPED_TRACE(optimizer);
    TempRun old_run, new_run;
    Net n(1, optimizer);
    n.train(3);
    const CheckpointMeta meta = n.meta(3);
    const std::string job = checkpoint_job(new_run.str(), meta.signature);
    const std::string old_path =
        save_checkpoint(old_run.str(), old_encoding(meta, *n.net, *n.opt, kKey, job), 3, 2);
    const std::string new_path = save_checkpoint(new_run.str(), meta, *n.net, *n.opt, kKey, job, 2);
    n.train(3);
    for (const std::string& path : {old_path, new_path}) {
      Net m(2, optimizer);
      decode_checkpoint(read_checkpoint_file(path, kKey, job), path, meta, *m.net, *m.opt);
      m.train(3);
      const auto want = n.net->named_parameters(), got = m.net->named_parameters();
      for (const auto& item : want)
        EXPECT_TRUE(torch::equal(item.value(), got[item.key()])) << path << " " << item.key();
      EXPECT_TRUE(torch::equal(n.net->named_buffers()["1.running_mean"],
                               m.net->named_buffers()["1.running_mean"]));
    }
    const core::RecordIndex index = open_checkpoint_file(new_path, kKey, job);
    EXPECT_EQ(index.integer("meta.step"), 3);
  }
}

// glibc's bytes in use (arena and mmap'd blocks); 0 under a sanitizer's allocator.
int64_t heap_in_use() {
  const struct mallinfo2 mi = ::mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

// The most heap in use while bytes pass through it, measured at every write.
struct PeakSink : core::ByteSink {
  int64_t peak = 0;
  uint64_t bytes = 0;
  void write(const char*, size_t n) override {
    peak = std::max(peak, heap_in_use());
    bytes += n;
  }
  using core::ByteSink::write;
};

// Writing holds no copy of the state: the heap grows by less than the largest tensor (1 MiB)
// while a 12 MB file streams, where the old encoding's record alone grew it by the file's size
// (which shows that the measure sees such a copy).
TEST(StateStream, WritingHoldsNoCopyOfTheState) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 4; ++i) net->push_back(torch::nn::Linear(512, 512));
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  adam.zero_grad();
  net->forward(torch::ones({2, 512})).sum().backward();
  adam.step();
  const CheckpointMeta meta{1, "seq", model_signature(*net), 2, 0};
  core::RecordStreamWriter record;
  write_state_entries(meta, *net, adam, record);
  ASSERT_GT(record.size(), 12'000'000u);

  const int64_t before_old = heap_in_use();
  int64_t old_growth = 0;
  {
    core::RecordWriter copy;
    write_state_entries(meta, *net, adam, copy);
    old_growth = heap_in_use() - before_old;
  }
  if (old_growth < static_cast<int64_t>(record.size() / 2))
    GTEST_SKIP() << "the heap is not measurable here (a sanitizer's allocator)";

  const int64_t before = heap_in_use();
  PeakSink sink;
  write_checkpoint(sink, record, kKey, "job");
  EXPECT_EQ(sink.bytes, record.size() + 24 + 40);
  EXPECT_LT(sink.peak - before, int64_t{1} << 20) << "old encoding grew it by " << old_growth;
}

}  // namespace
}  // namespace krab::train
