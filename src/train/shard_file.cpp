#include "train/shard_file.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/file_source.h"
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

namespace {

constexpr size_t kChunkBytes = 1 << 20;

// Checks a shard's frame in one streaming pass over `src`: its SHA-256 against `want_sha256`
// (skipped when ""), its seal, magic, version, length and CRC, in the order the messages
// promise (the digest first: a changed file is named as that; then the seal: with a key,
// nothing of a file that fails it is judged further). Returns the payload's length; the
// payload starts at kHeaderBytes.
uint64_t verify_shard(const core::ByteSource& src, const std::string& want_sha256,
                      const std::string& seal_key, const std::string& job) {
  const std::string& source = src.name();
  const uint64_t size = src.size();
  const uint64_t body = size - (core::is_sealed(src) ? 40 : 0);
  std::string header(std::min<uint64_t>(body, kHeaderBytes), '\0');
  src.read(0, header.data(), header.size());
  const uint64_t length = header.size() == kHeaderBytes ? get<uint64_t>(header, 12) : 0;
  // The payload the header states, if the file holds exactly that much: the CRC covers it.
  const bool framed = header.size() == kHeaderBytes && body >= kHeaderBytes + kTrailerBytes &&
                      body - kHeaderBytes - kTrailerBytes == length;
  core::Sha256Stream sha;
  core::SealStream seal(seal_key, job);
  uint32_t crc = 0;
  std::string chunk(std::min<uint64_t>(size, kChunkBytes), '\0');
  for (uint64_t at = 0; at < size; at += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - at));
    src.read(at, chunk.data(), n);
    if (!want_sha256.empty()) sha.update(chunk.data(), n);
    if (at < body) seal.update(chunk.data(), static_cast<size_t>(std::min<uint64_t>(n, body - at)));
    const uint64_t lo = std::max<uint64_t>(at, kHeaderBytes),
                   hi = std::min(at + n, kHeaderBytes + length);
    if (framed && lo < hi) crc = crc32_update(crc, chunk.data() + (lo - at), hi - lo);
  }
  if (!want_sha256.empty() && sha.hex() != want_sha256)
    throw CorruptData(str_cat("shard '", source,
                              "' does not match the SHA-256 the manifest records: it was changed "
                              "or belongs to another checkpoint"));
  if (core::sealed_length(src, seal_key) > 0) core::check_seal(seal, src);
  if (header.size() < kHeaderBytes || body < kHeaderBytes + kTrailerBytes ||
      std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0)
    throw CorruptData(str_cat("shard '", source, "' is not a krab checkpoint shard (bad header)"));
  const auto version = get<uint32_t>(header, 8);
  if (version != kVersion)
    throw CorruptData(str_cat("shard '", source, "' has format version ", version,
                              "; this krab reads version ", kVersion));
  if (!framed)
    throw CorruptData(str_cat("shard '", source, "' is truncated or padded: header says ", length,
                              " payload bytes, file has ", body - kHeaderBytes - kTrailerBytes));
  std::string trailer(kTrailerBytes, '\0');
  src.read(kHeaderBytes + length, trailer.data(), trailer.size());
  if (crc != get<uint32_t>(trailer, 0))
    throw CorruptData(str_cat("shard '", source, "' failed its CRC-32 check (corrupt)"));
  return length;
}

}  // namespace

core::Record parse_shard_bytes(std::string bytes, const std::string& source,
                               const std::string& seal_key, const std::string& job) {
  auto src = std::make_shared<core::MemorySource>(bytes.data(), bytes.size(), source);
  const uint64_t length = verify_shard(*src, "", seal_key, job);
  // load() copies every entry out, so the Record does not need `bytes`.
  return core::RecordIndex(src, kHeaderBytes, length, source)
      .load([](const std::string&, core::RecordIndex::Kind) { return true; });
}

core::RecordIndex open_shard_file(std::shared_ptr<const core::ByteSource> file,
                                  const ShardDigest& want, const std::string& seal_key,
                                  const std::string& job) {
  // The size first, from the stat: a truncated shard is refused without reading its bytes.
  if (file->size() != want.bytes)
    throw CorruptData(str_cat("shard '", file->name(), "' is truncated or padded: ", file->size(),
                              " bytes, the manifest says ", want.bytes));
  const uint64_t length = verify_shard(*file, want.sha256, seal_key, job);
  const std::string name = file->name();
  return core::RecordIndex(std::move(file), kHeaderBytes, length, name);
}

core::RecordIndex read_shard_file(const std::string& path, const ShardDigest& want,
                                  const std::string& seal_key, const std::string& job) {
  if (!core::path_exists(path))
    throw CorruptData(str_cat("shard '", path,
                              "' is missing (the manifest names it; every rank reads the shards "
                              "its part comes from: the run directory must be on a file system "
                              "every rank sees)"));
  return open_shard_file(std::make_shared<core::FileSource>(path), want, seal_key, job);
}

}  // namespace krab::train
