// Gaussian noise for differential privacy that nobody can predict or subtract.
//
// Why not torch's generator: ATen's CPU generator is an mt19937 that keeps 32 bits of its
// 64-bit seed, so 2^32 candidate seeds reproduce any noise it drew (a search of 2^20 took 3 s);
// a server could then strip local-DP noise from each update, and anyone who saw two global
// models could strip central-DP noise. Here:
//   - bits: the ChaCha20 keystream (libsodium's crypto_stream_chacha20) under a 256-bit key
//     drawn from the operating system for every SecureNoise; chunk c of the stream uses nonce c.
//     Nothing in a job file or a seed reaches the key;
//   - uniforms: 53-bit doubles in (0, 1), never 0, from 64-bit words;
//   - normals: Box-Muller in double precision;
//   - each output is the sum of four such normals divided by 2 (still N(0, 1)), the defence of
//     Holohan & Braghin ("Secure random sampling in differential privacy", 2021) and Opacus's
//     secure mode against Mironov's floating-point attack (2012): the set of doubles one
//     Box-Muller draw can produce is sparse and structured enough to reveal the noiseless value;
//     a sum of four smears that structure away.
// Cost: 32 bytes of keystream and 2 Box-Muller pairs per output value (about 60 ms per million
// values on one core here), once per round per model: small beside local training.
//
// Thread safety: one SecureNoise per thread (it is a stream with a position).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace krab::federated {

class SecureNoise {
 public:
  // A fresh 256-bit key from the OS (libsodium's randombytes).
  SecureNoise();
  // A fixed key: reproducible noise, for tests of the transform only. Never for DP noise.
  explicit SecureNoise(const std::array<uint8_t, 32>& key);
  ~SecureNoise();
  SecureNoise(const SecureNoise&) = delete;
  SecureNoise& operator=(const SecureNoise&) = delete;

  // out[i] = stddev * N(0, 1) for i < n (stddev >= 0, finite).
  void gaussian(double stddev, double* out, size_t n);

 private:
  void refill();
  std::array<uint8_t, 32> key_;
  uint64_t chunk_ = 0;
  static constexpr size_t kWords = 4096;  // 64-bit words per keystream chunk (32 KiB)
  uint64_t words_[kWords];
  size_t next_ = kWords;
};

}  // namespace krab::federated
