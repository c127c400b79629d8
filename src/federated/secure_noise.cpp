#include "federated/secure_noise.h"

#include <sodium.h>

#include <cmath>
#include <cstring>

#include "core/errors.h"

namespace krab::federated {
namespace {

void init_sodium() { KRAB_CHECK(sodium_init() >= 0, "libsodium failed to initialise"); }

}  // namespace

SecureNoise::SecureNoise() {
  init_sodium();
  randombytes_buf(key_.data(), key_.size());
}

SecureNoise::SecureNoise(const std::array<uint8_t, 32>& key) : key_(key) { init_sodium(); }

// The key lives only as long as the noise it made is in flight; wipe it.
SecureNoise::~SecureNoise() {
  sodium_memzero(key_.data(), key_.size());
  sodium_memzero(words_, sizeof words_);
}

void SecureNoise::refill() {
  static_assert(crypto_stream_chacha20_KEYBYTES == 32, "ChaCha20 takes a 256-bit key");
  uint8_t nonce[crypto_stream_chacha20_NONCEBYTES] = {};
  static_assert(sizeof nonce == sizeof chunk_, "one nonce per chunk");
  std::memcpy(nonce, &chunk_, sizeof chunk_);
  ++chunk_;
  crypto_stream_chacha20(reinterpret_cast<unsigned char*>(words_), sizeof words_, nonce,
                         key_.data());
  next_ = 0;
}

void SecureNoise::gaussian(double stddev, double* out, size_t n) {
  KRAB_CHECK_ARG(std::isfinite(stddev) && stddev >= 0, "noise stddev must be finite and >= 0, got ",
                 stddev);
  // (k + 0.5) / 2^53 for the top 53 bits k: uniform on a grid strictly inside (0, 1), so the
  // logarithm below is always finite.
  auto uniform = [this] {
    if (next_ == kWords) refill();
    return (static_cast<double>(words_[next_++] >> 11) + 0.5) * 0x1.0p-53;
  };
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int pair = 0; pair < 2; ++pair) {
      const double r = std::sqrt(-2.0 * std::log(uniform()));
      const double theta = kTwoPi * uniform();
      sum += r * std::cos(theta) + r * std::sin(theta);
    }
    out[i] = stddev * (sum / 2);
  }
}

}  // namespace krab::federated
