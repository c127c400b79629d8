#include "core/seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>

#include <algorithm>
#include <filesystem>

#include "core/byte_source.h"
#include "core/errors.h"
#include "core/fs.h"

namespace krab::core {
namespace {

constexpr char kTag[] = "KRABSEAL";
constexpr size_t kTagBytes = 8, kMacBytes = 32, kSealBytes = kTagBytes + kMacBytes;
constexpr size_t kMinKeyBytes = 32;

std::string mac(const std::string& key, const char* data, size_t n) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KRAB_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                  reinterpret_cast<const unsigned char*>(data), n, out, &len) != nullptr &&
                 len == kMacBytes,
             "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

// The key a job's seals are made with: a separate key per job, derived from the user's, so a
// seal cannot be moved from one job's file to another's.
std::string job_key(const std::string& key, const std::string& job) {
  if (job.empty()) return key;
  const std::string label = "krab-seal-job\n" + job;
  return mac(key, label.data(), label.size());
}

bool sealed(const std::string& bytes) {
  return bytes.size() >= kSealBytes &&
         bytes.compare(bytes.size() - kSealBytes, kTagBytes, kTag, kTagBytes) == 0;
}

}  // namespace

bool is_sealed(const std::string& bytes) { return sealed(bytes); }

std::string read_seal_key(const std::string& path, const std::string& run_dir) {
  if (path.empty()) return "";
  namespace fs = std::filesystem;
  KRAB_CHECK_ARG(path_exists(path), "checkpoint.hmac_key_file: file '", path, "' does not exist");
  std::error_code ec;
  const fs::path key = fs::weakly_canonical(path, ec);
  const fs::path dir = fs::weakly_canonical(run_dir, ec);
  const std::string k = key.string(), d = dir.string();
  KRAB_CHECK_ARG(!(k.size() > d.size() && k.compare(0, d.size(), d) == 0 && k[d.size()] == '/'),
                 "checkpoint.hmac_key_file: '", path, "' is inside the run directory '", run_dir,
                 "'; keep the key where whoever can write checkpoints cannot read it");
  std::string bytes = read_file(path);
  KRAB_CHECK_ARG(bytes.size() >= kMinKeyBytes, "checkpoint.hmac_key_file: '", path, "' holds ",
                 bytes.size(), " bytes; a key needs at least ", kMinKeyBytes,
                 " (e.g. openssl rand -hex 32 > FILE)");
  return bytes;
}

std::string job_identity(const std::string& kind, const std::string& run_dir,
                         const std::string& signature) {
  namespace fs = std::filesystem;
  return str_cat(kind, "\n", fs::absolute(run_dir).lexically_normal().string(), "\n", signature);
}

std::string hmac_sha256(const std::string& key, const std::string& data) {
  return mac(key, data.data(), data.size());
}

// OpenSSL 3's EVP_MAC: HMAC_CTX is deprecated there.
struct SealStream::Mac {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
  ~Mac() {
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
  }
};

SealStream::SealStream(const std::string& key, const std::string& job) {
  if (key.empty()) return;
  mac_ = std::make_unique<Mac>();
  const std::string k = job_key(key, job);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  mac_->mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  mac_->ctx = mac_->mac ? EVP_MAC_CTX_new(mac_->mac) : nullptr;
  KRAB_CHECK(mac_->ctx != nullptr &&
                 EVP_MAC_init(mac_->ctx, reinterpret_cast<const unsigned char*>(k.data()), k.size(),
                              params) == 1,
             "HMAC-SHA256 failed to start");
}

SealStream::~SealStream() = default;

void SealStream::update(const char* data, size_t n) {
  if (!mac_) return;
  KRAB_CHECK(EVP_MAC_update(mac_->ctx, reinterpret_cast<const unsigned char*>(data), n) == 1,
             "HMAC-SHA256 failed");
}

std::string SealStream::finish() {
  if (!mac_) return "";
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  KRAB_CHECK(EVP_MAC_final(mac_->ctx, out, &len, sizeof(out)) == 1 && len == kMacBytes,
             "HMAC-SHA256 failed");
  mac_.reset();
  return std::string(kTag, kTagBytes) + std::string(reinterpret_cast<const char*>(out), len);
}

struct Sha256Stream::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256Stream::Sha256Stream() : ctx_(std::make_unique<Ctx>()) {
  KRAB_CHECK(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1,
             "SHA-256 failed to start");
}

Sha256Stream::~Sha256Stream() = default;

void Sha256Stream::update(const char* data, size_t n) {
  KRAB_CHECK(EVP_DigestUpdate(ctx_->md, data, n) == 1, "SHA-256 failed");
}

std::string Sha256Stream::hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KRAB_CHECK(EVP_DigestFinal_ex(ctx_->md, out, &len) == 1 && len == 32, "SHA-256 failed");
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex += digits[out[i] >> 4];
    hex += digits[out[i] & 15];
  }
  return hex;
}

std::string sha256_hex(const char* data, size_t n) {
  Sha256Stream s;
  s.update(data, n);
  return s.hex();
}

std::string seal(std::string bytes, const std::string& key, const std::string& job) {
  SealStream stream(key, job);
  stream.update(bytes.data(), bytes.size());
  bytes += stream.finish();
  return bytes;
}

namespace {

[[noreturn]] void refuse_sealed_without_key(const std::string& source) {
  throw CorruptData(str_cat("'", source,
                            "' is sealed with a key (HMAC); give this run its "
                            "checkpoint.hmac_key_file to read it"));
}
[[noreturn]] void refuse_unsealed(const std::string& source) {
  throw CorruptData(str_cat("'", source,
                            "' carries no seal, and checkpoint.hmac_key_file is "
                            "set: refusing a file that may have been replaced"));
}
[[noreturn]] void refuse_wrong_seal(const std::string& source) {
  throw CorruptData(str_cat("'", source,
                            "' fails its seal (HMAC): it was changed, written "
                            "with another key, or written for another run or model"));
}

}  // namespace

std::string unseal(std::string bytes, const std::string& key, const std::string& source,
                   const std::string& job) {
  if (key.empty()) {
    if (sealed(bytes)) refuse_sealed_without_key(source);
    return bytes;
  }
  if (!sealed(bytes)) refuse_unsealed(source);
  const size_t body = bytes.size() - kSealBytes;
  const std::string want = mac(job_key(key, job), bytes.data(), body);
  if (CRYPTO_memcmp(want.data(), bytes.data() + body + kTagBytes, kMacBytes) != 0)
    refuse_wrong_seal(source);
  bytes.resize(body);
  return bytes;
}

namespace {
// The last kSealBytes of `src` (fewer for a shorter file).
std::string tail_of(const ByteSource& src) {
  std::string tail(std::min<uint64_t>(src.size(), kSealBytes), '\0');
  src.read(src.size() - tail.size(), tail.data(), tail.size());
  return tail;
}
}  // namespace

bool is_sealed(const ByteSource& src) { return sealed(tail_of(src)); }

size_t sealed_length(const ByteSource& src, const std::string& key) {
  const bool is = sealed(tail_of(src));
  if (key.empty() && is) refuse_sealed_without_key(src.name());
  if (!key.empty() && !is) refuse_unsealed(src.name());
  return is ? kSealBytes : 0;
}

void check_seal(SealStream& stream, const ByteSource& src) {
  const std::string want = stream.finish(), tail = tail_of(src);
  if (want.size() != kSealBytes || tail.size() != kSealBytes ||
      CRYPTO_memcmp(want.data() + kTagBytes, tail.data() + kTagBytes, kMacBytes) != 0)
    refuse_wrong_seal(src.name());
}

}  // namespace krab::core
