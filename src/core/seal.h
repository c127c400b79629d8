// Files that prove who wrote them: an optional HMAC-SHA256 seal for checkpoints and the
// federated server's state.
//
// A CRC finds damage, not tampering: anyone who can write a run directory could replace the
// model in a checkpoint, or rewrite fl-state.krab's round history and with it the privacy
// accounting. With `checkpoint.hmac_key_file` set, every such file krab writes ends in a seal,
//   "KRABSEAL" + HMAC-SHA256(key, everything before the seal)          (40 bytes)
// and every such file it reads must carry a valid one. The key lives in a file outside the run
// directory (read_seal_key refuses one inside it): whoever can write checkpoints but cannot read
// the key cannot forge them.
//
// Errors: CorruptData naming the file for a missing or wrong seal, or for a sealed file read
// without a key; InvalidArgument naming checkpoint.hmac_key_file for a bad key file. Pure apart
// from read_seal_key's file read; thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace krab::core {

class ByteSource;  // core/byte_source.h

// The key in `path` (its bytes, at least 32), or "" when `path` is "" (sealing off).
// `run_dir`: the run directory, which must not contain the key file.
std::string read_seal_key(const std::string& path, const std::string& run_dir);

// "kind\nABSOLUTE RUN DIRECTORY\nsignature": what a seal and a release counter are bound to.
// The directory is made absolute and normalised lexically, without following symbolic links: a
// link swapped in for the run directory does not make it another job.
std::string job_identity(const std::string& kind, const std::string& run_dir,
                         const std::string& signature);

// `bytes` with its seal for `job` appended; `bytes` unchanged when `key` is "". (`job` "" gives
// the seal of a file bound to no job, the MAC of the bytes under `key` itself.)
std::string seal(std::string bytes, const std::string& key, const std::string& job = "");

// The bytes without their seal, after checking it against `key` and `job`. With `key` "", a
// sealed file is refused (it was written with a key this run does not have) and an unsealed one
// returned as it is.
std::string unseal(std::string bytes, const std::string& key, const std::string& source,
                   const std::string& job = "");

// Whether `bytes` end in a seal's tag (not whether the seal is valid: unseal() says that).
bool is_sealed(const std::string& bytes);

// seal() for bytes that stream past and are never held whole (a shard of a sharded
// checkpoint): update() with every byte before the seal, in order, then finish() gives the
// seal to append — "" when `key` is "" (sealing off). seal(b, key, job) == b +
// (SealStream(key, job) fed b).finish(). One thread; finish() once.
class SealStream {
 public:
  SealStream(const std::string& key, const std::string& job = "");
  ~SealStream();
  SealStream(const SealStream&) = delete;
  SealStream& operator=(const SealStream&) = delete;
  void update(const char* data, size_t n);
  std::string finish();

 private:
  struct Mac;
  std::unique_ptr<Mac> mac_;  // null when sealing is off
};

// unseal() for a file read in place (a ByteSource), in two halves around one streaming pass:
// sealed_length() reads the last 40 bytes of `src` only and applies unseal()'s rules about a
// seal's presence (a sealed file without a key, an unsealed one with a key: CorruptData naming
// src.name(), the same words); it returns the seal's length at the end of `src` (0 or 40).
// check_seal() takes a SealStream(key, job) that has seen every byte before the seal and
// refuses, as unseal() does, a seal that is not the one those bytes and the key give.
// is_sealed(src) says whether `src` ends in a seal's tag, as is_sealed(bytes), reading 40 bytes.
bool is_sealed(const ByteSource& src);
size_t sealed_length(const ByteSource& src, const std::string& key);
void check_seal(SealStream& stream, const ByteSource& src);

// SHA-256 of bytes that stream past; hex() (64 lowercase hex digits) once at the end.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void update(const char* data, size_t n);
  std::string hex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// SHA-256 of `data`, as Sha256Stream::hex().
std::string sha256_hex(const char* data, size_t n);

// HMAC-SHA256 of `data` under `key`: 32 bytes.
std::string hmac_sha256(const std::string& key, const std::string& data);

}  // namespace krab::core
