// krab's own random numbers for data: generation, shuffling, synthetic sets.
//
// Why not torch's generator or <random>'s distributions: torch's global generator is shared
// state any caller may reseed or advance, and std::uniform_int_distribution /
// std::normal_distribution are implementation-defined, so the same seed could give different
// data under another standard library. The determinism contract needs bits that depend on the
// seed alone. std::mt19937_64's output sequence *is* fixed by the standard, so it is the engine,
// and the transforms from its 64-bit words to numbers are written out here.
//
// Header-only, no state beyond the engine the caller owns; not thread-safe per engine.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace krab::data {

// splitmix64 turns (seed, stream) into well-spread seeds (core/rng.h).
using core::splitmix64;

// Seed for the independent stream `stream` of `seed` (e.g. one per epoch).
inline uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  return splitmix64(splitmix64(seed) ^ splitmix64(stream + 0x632be59bd9b4e019ULL));
}

// Uniform double in [0, 1) with 53 random bits.
inline double uniform01(std::mt19937_64& rng) { return (rng() >> 11) * 0x1.0p-53; }

// Uniform integer in [0, n), n >= 1, without modulo bias (Lemire's multiply-and-reject).
inline uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(rng()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(rng()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// Standard normal sample (Box-Muller; one of the pair is discarded to keep the function
// stateless, which costs nothing that matters at data-generation sizes).
inline double standard_normal(std::mt19937_64& rng) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1], so log is finite
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Shuffles values[0..n) uniformly in place (Fisher-Yates, from the last element down).
inline void shuffle_in_place(int64_t* values, int64_t n, std::mt19937_64& rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(values[i], values[j]);
  }
}

// A uniformly random permutation of 0..n-1 (Fisher-Yates).
inline std::vector<int64_t> random_permutation(int64_t n, std::mt19937_64& rng) {
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  shuffle_in_place(perm.data(), n, rng);
  return perm;
}

}  // namespace krab::data
