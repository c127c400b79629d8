// Shards and state files are read in place (train/shard_file.h, core/record.h's RecordIndex):
// the size is checked before a byte is read, the digests in one pass of bounded reads, and a
// rank then reads the ranges it restores and nothing else.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "core/file_source.h"
#include "core/fs.h"
#include "core/seal.h"
#include "train/checkpoint.h"
#include "train/shard_file.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

// Counts what is read through it: all bytes, and the largest single read (what a reader must
// hold at once).
struct Counting : core::ByteSource {
  explicit Counting(std::shared_ptr<core::ByteSource> in) : inner(std::move(in)) {}
  uint64_t size() const override { return inner->size(); }
  void read(uint64_t offset, char* dst, size_t n) const override {
    bytes += n;
    largest = std::max<uint64_t>(largest, n);
    inner->read(offset, dst, n);
  }
  const std::string& name() const override { return inner->name(); }
  std::shared_ptr<core::ByteSource> inner;
  mutable uint64_t bytes = 0, largest = 0;
};

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / ("krab-shard-stream-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

// A shard whose unit 1 holds `big` floats (0, 1, 2, ...) after a small unit 0.
ShardDigest write_shard(const std::string& path, int64_t big, const std::string& key = "") {
  core::RecordStreamWriter w;
  const at::Tensor small = torch::tensor({0.5f, 1.5f, 2.5f, 3.5f});
  const at::Tensor values = torch::arange(big, torch::kFloat32);
  w.add_string("meta.checkpoint_id", std::string(32, 'a'));
  w.add_tensor("unit.0.values", small);
  w.add_tensor("unit.1.values", values);
  w.add_int("meta.step", 3);
  return write_shard_file(path, w, key, key.empty() ? "" : "job");
}

TEST(ShardStream, ATruncatedShardIsRefusedBySizeBeforeAnyByteIsRead) {
  TempDir dir;
  const std::string path = (dir.path / "shard-00001-of-00002.krab").string();
  const ShardDigest want = write_shard(path, 1000);
  fs::resize_file(path, want.bytes - 9);
  auto file = std::make_shared<Counting>(std::make_shared<core::FileSource>(path));
  try {
    open_shard_file(file, want, "", "");
    ADD_FAILURE() << "a truncated shard was opened";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("shard '" + path + "' is truncated or padded"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(file->bytes, 0u);
}

// A 64 MiB shard: opening it reads it once, in reads of at most 1 MiB (the pass that checks
// its SHA-256, seal and CRC, and the index's header windows); a range of unit 1 then reads
// exactly its bytes. The values are the ones written.
TEST(ShardStream, OpeningReadsInBoundedChunksAndARangeReadsOnlyItself) {
  TempDir dir;
  const std::string path = (dir.path / "shard-00000-of-00001.krab").string();
  constexpr int64_t kBig = 16 << 20;
  for (const std::string key : {"", "k-0123456789abcdef0123456789abcdef"}) {
    SCOPED_TRACE(key.empty() ? "unsealed" : "sealed");
    const ShardDigest want = write_shard(path, kBig, key);
    ASSERT_GT(want.bytes, uint64_t{64} << 20);
    auto file = std::make_shared<Counting>(std::make_shared<core::FileSource>(path));
    const core::RecordIndex index = open_shard_file(file, want, key, key.empty() ? "" : "job");
    EXPECT_LE(file->largest, uint64_t{1} << 20);
    EXPECT_LT(file->bytes, want.bytes + (uint64_t{1} << 20));
    file->bytes = 0;
    float got[3];
    index.read("unit.1.values", kBig - 7, 3, got);
    EXPECT_EQ(file->bytes, 12u);
    EXPECT_EQ(got[0], static_cast<float>(kBig - 7));
    EXPECT_EQ(got[2], static_cast<float>(kBig - 5));
    EXPECT_TRUE(
        torch::equal(index.tensor("unit.0.values"), torch::tensor({0.5f, 1.5f, 2.5f, 3.5f})));
    EXPECT_EQ(index.integer("meta.step"), 3);
  }
}

// The same file read by the whole-bytes parser (the fuzz target's entry point) and opened in
// place give the same record; a byte flipped inside the payload fails the digest first when
// one is known, the CRC otherwise — with the same words as before streaming.
TEST(ShardStream, ParserAndStreamedOpenAgreeAndRefuseTheSameDamage) {
  TempDir dir;
  const std::string path = (dir.path / "shard-00000-of-00001.krab").string();
  const ShardDigest want = write_shard(path, 100);
  const core::Record whole = parse_shard_bytes(core::read_file(path), path, "", "");
  const core::RecordIndex index = read_shard_file(path, want, "", "");
  EXPECT_TRUE(torch::equal(whole.tensor("unit.1.values"), index.tensor("unit.1.values")));
  std::string bytes = core::read_file(path);
  bytes[200] ^= 0x10;
  core::write_file_atomic(path, bytes);
  const auto refusal = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const CorruptData& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal([&] { read_shard_file(path, want, "", ""); }).find("SHA-256"),
            std::string::npos);
  const ShardDigest same_sha{want.bytes, core::sha256_hex(bytes.data(), bytes.size())};
  EXPECT_NE(refusal([&] { read_shard_file(path, same_sha, "", ""); }).find("CRC-32"),
            std::string::npos);
  EXPECT_NE(refusal([&] { parse_shard_bytes(bytes, path, "", ""); }).find("CRC-32"),
            std::string::npos);
}

}  // namespace
}  // namespace krab::train
