// splitmix64: the one small, seedable, platform-independent generator every layer uses
// (data seeds, compression's stochastic rounding and random-k, federated cohorts).
//
// Why this and not <random>'s distributions: those are implementation-defined, so the same seed
// could give different bits under another standard library; splitmix64's output is fixed by
// its four lines. Header-only, no torch; not thread-safe per generator.
#pragma once

#include <cstdint>

namespace krab::core {

// The splitmix64 finaliser: a bijective mix of 64 bits (Steele, Lea & Flood 2014).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The generator: the state advances by the golden-ratio increment, each output is the mix of
// the state. SplitMix64(s).next() == splitmix64(s).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    const uint64_t out = splitmix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return out;
  }
  // Uniform float in [0, 1) with 24 random bits.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, bound), bound >= 1, without modulo bias: rejects the top partial block.
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace krab::core
