#include "train/shard_file.h"

#include <cstring>

#include "core/errors.h"
#include "core/fs.h"
#include "core/le_bytes.h"
#include "core/seal.h"
#include "train/checkpoint.h"

namespace krab::train {
namespace {

constexpr char kMagic[8] = {'K', 'R', 'A', 'B', 'S', 'H', 'R', 'D'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8, kTrailerBytes = 4;

template <typename T>
void put(std::string& out, T v) {
  core::put_le(out, v);
}
template <typename T>
T get(const std::string& in, size_t at) {
  return core::get_le<T>(in, at);
}

// Forwards to the file while the digests see every byte: the SHA-256 all of them, the seal
// all of them, the CRC only the payload's (counting_ says when that is).
class DigestingSink : public core::ByteSink {
 public:
  DigestingSink(core::ByteSink& out, core::SealStream& seal) : out_(out), seal_(seal) {}
  void write(const char* data, size_t n) override {
    out_.write(data, n);
    sha_.update(data, n);
    seal_.update(data, n);
    if (counting_) crc_ = crc32_update(crc_, data, n);
    bytes_ += n;
  }
  using core::ByteSink::write;
  void count_crc(bool on) { counting_ = on; }
  uint32_t crc() const { return crc_; }
  // Bytes past the digests, e.g. the seal itself, which the SHA-256 covers and the seal not.
  void write_sealed_tail(const std::string& tail) {
    out_.write(tail);
    sha_.update(tail.data(), tail.size());
    bytes_ += tail.size();
  }
  ShardDigest digest() { return {bytes_, sha_.hex()}; }

 private:
  core::ByteSink& out_;
  core::SealStream& seal_;
  core::Sha256Stream sha_;
  uint32_t crc_ = 0;
  bool counting_ = false;
  uint64_t bytes_ = 0;
};

}  // namespace

ShardDigest write_shard_file(const std::string& path, const core::RecordStreamWriter& record,
                             const std::string& seal_key, const std::string& job) {
  core::AtomicFileWriter file(path);
  core::SealStream seal(seal_key, job);
  DigestingSink out(file, seal);
  std::string header(kMagic, sizeof(kMagic));
  put<uint32_t>(header, kVersion);
  put<uint64_t>(header, record.size());
  out.write(header);
  out.count_crc(true);
  record.write(out);
  out.count_crc(false);
  std::string trailer;
  put<uint32_t>(trailer, out.crc());
  out.write(trailer);
  out.write_sealed_tail(seal.finish());
  file.commit();
  return out.digest();
}

core::Record parse_shard_bytes(std::string bytes, const std::string& source,
                               const std::string& seal_key, const std::string& job) {
  // The seal first: with a key, nothing of a file that fails it is looked at further.
  bytes = core::unseal(std::move(bytes), seal_key, source, job);
  if (bytes.size() < kHeaderBytes + kTrailerBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw CorruptData(str_cat("shard '", source, "' is not a krab checkpoint shard (bad header)"));
  const auto version = get<uint32_t>(bytes, 8);
  if (version != kVersion)
    throw CorruptData(str_cat("shard '", source, "' has format version ", version,
                              "; this krab reads version ", kVersion));
  const auto length = get<uint64_t>(bytes, 12);
  if (bytes.size() - kHeaderBytes - kTrailerBytes != length)
    throw CorruptData(str_cat("shard '", source, "' is truncated or padded: header says ", length,
                              " payload bytes, file has ",
                              bytes.size() - kHeaderBytes - kTrailerBytes));
  if (crc32_update(0, bytes.data() + kHeaderBytes, length) !=
      get<uint32_t>(bytes, kHeaderBytes + length))
    throw CorruptData(str_cat("shard '", source, "' failed its CRC-32 check (corrupt)"));
  return core::Record::parse(bytes.data() + kHeaderBytes, length, source);
}

core::Record read_shard_file(const std::string& path, const ShardDigest& want,
                             const std::string& seal_key, const std::string& job) {
  if (!core::path_exists(path))
    throw CorruptData(str_cat("shard '", path,
                              "' is missing (the manifest names it; every rank reads the shards "
                              "its part comes from: the run directory must be on a file system "
                              "every rank sees)"));
  std::string bytes = core::read_file(path);
  if (bytes.size() != want.bytes)
    throw CorruptData(str_cat("shard '", path, "' is truncated or padded: ", bytes.size(),
                              " bytes, the manifest says ", want.bytes));
  if (core::sha256_hex(bytes.data(), bytes.size()) != want.sha256)
    throw CorruptData(str_cat("shard '", path,
                              "' does not match the SHA-256 the manifest records: it was changed "
                              "or belongs to another checkpoint"));
  return parse_shard_bytes(std::move(bytes), path, seal_key, job);
}

}  // namespace krab::train
