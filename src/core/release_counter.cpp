#include "core/release_counter.h"

#include <openssl/crypto.h>

#include <cstring>
#include <filesystem>
#include <utility>

#include "core/errors.h"
#include "core/fs.h"
#include "core/seal.h"

namespace krab::core {
namespace {

constexpr char kMagic[8] = {'K', 'R', 'A', 'B', 'R', 'N', 'D', '1'};
constexpr size_t kBodyBytes = 8 + 8, kFileBytes = kBodyBytes + 32;

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

}  // namespace

ReleaseCounter::ReleaseCounter(const std::string& key_file, std::string key, std::string job)
    : key_(std::move(key)), job_(std::move(job)) {
  if (key_file.empty()) key_.clear();
  // The name is derived with the key so that jobs never share a file and a name reveals nothing
  // of the run directory it counts for.
  if (enabled())
    path_ = str_cat(key_file, ".rounds-",
                    hex(hmac_sha256(key_, "krab-release-counter-name\n" + job_)).substr(0, 16));
}

int64_t ReleaseCounter::value() const {
  if (!enabled() || !path_exists(path_)) return 0;
  std::error_code ec;
  if (std::filesystem::file_size(path_, ec) != kFileBytes || ec)
    throw CorruptData(str_cat("'", path_, "' (the count of this run's released rounds) is not ",
                              kFileBytes, " bytes long"));
  const std::string bytes = read_file(path_);
  const std::string want =
      hmac_sha256(hmac_sha256(key_, "krab-release-counter\n" + job_), bytes.substr(0, kBodyBytes));
  if (bytes.size() != kFileBytes || bytes.compare(0, 8, kMagic, 8) != 0 ||
      CRYPTO_memcmp(want.data(), bytes.data() + kBodyBytes, 32) != 0)
    throw CorruptData(str_cat("'", path_,
                              "' (the count of this run's released rounds, beside "
                              "checkpoint.hmac_key_file) fails its check: it was changed, or "
                              "written with another key"));
  int64_t rounds = 0;
  std::memcpy(&rounds, bytes.data() + 8, 8);
  if (rounds < 0) throw CorruptData(str_cat("'", path_, "' holds a negative round count"));
  return rounds;
}

void ReleaseCounter::advance(int64_t rounds) const {
  if (!enabled() || rounds <= value()) return;
  std::string body(kMagic, 8);
  body.append(reinterpret_cast<const char*>(&rounds), 8);
  write_file_atomic(path_,
                    body + hmac_sha256(hmac_sha256(key_, "krab-release-counter\n" + job_), body));
}

}  // namespace krab::core
