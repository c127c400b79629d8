// Element codecs: how a block of float32 values is turned into bytes for the wire and back.
//
// Used by the codec hooks (compress/hooks.h), which move the bytes with all-to-all and
// all-gather. Every codec works on blocks whose length is a multiple of chunk(); its encoding
// of n values has a fixed size, encoded_bytes(n), so every rank knows every payload's size.
//
//   fp16    IEEE half, round to nearest even                        2 bytes / value
//   bf16    bfloat16 (fp32's exponent, 8-bit mantissa), nearest even 2 bytes / value
//   int8    per chunk: fp32 scale s = max|x| / 127, then q = floor(x / s + u), u ~ U[0, 1)
//           (stochastic rounding: E[q s] = x, unbiased; QSGD-style)  1 byte / value + 4 / chunk
//   onebit  per chunk: bf16 s+ = mean of the values >= 0, bf16 s- = mean |x| of the negative
//           ones, then one sign bit per value; decodes to s+ or -s- (two-level 1-bit SGD,
//           Seide et al. 2014; biased: use it with error feedback)  1 bit / value + 4 / chunk
//           optionally (krab's default) after a randomized Hadamard rotation of the chunk,
//           both levels then scaled so that <decoded, x> = |x|^2 (DRIVE, Vargaftik et al. 2021)
//
// Pure functions of their input (and, for int8, the Rng), no state: testable without a network.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/rng.h"

namespace krab::compress {

// Small, fast, seedable generator for stochastic rounding and random-k (core/rng.h).
using Rng = core::SplitMix64;

// Mixes several values into one seed (same inputs, same seed, on every rank).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string name() const = 0;
  // Block lengths passed to encode/decode must be multiples of this.
  virtual int64_t chunk() const = 0;
  virtual int64_t encoded_bytes(int64_t n) const = 0;
  virtual void encode(const float* x, int64_t n, uint8_t* out, Rng& rng) const = 0;
  virtual void decode(const uint8_t* in, int64_t n, float* out) const = 0;
  // Whether E[decode(encode(x))] = x over the Rng.
  virtual bool unbiased() const = 0;
};

// `name`: fp16 | bf16 | int8 | onebit. `chunk`: values per scale (int8, onebit); 0 picks the
// codec's default: 256 for int8 (4 bytes of scale per 256) and for onebit (two bf16 per 256).
// `rotate` (onebit only; chunk a power of 2): signs of each chunk after a randomized Hadamard
// rotation (see codecs.cpp).
std::unique_ptr<Codec> make_codec(const std::string& name, int64_t chunk, bool rotate = false);

}  // namespace krab::compress
