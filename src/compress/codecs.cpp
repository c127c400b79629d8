#include "compress/codecs.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/errors.h"

namespace krab::compress {

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  Rng r(a);
  uint64_t h = r.next();
  for (uint64_t v : {b, c, d}) {
    Rng s(h ^ (v * 0xD6E8FEB86659FD93ull));
    h = s.next();
  }
  return h;
}

namespace {

template <typename Half>
class CastCodec : public Codec {
 public:
  explicit CastCodec(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  int64_t chunk() const override { return 1; }
  int64_t encoded_bytes(int64_t n) const override { return 2 * n; }
  bool unbiased() const override { return false; }
  void encode(const float* x, int64_t n, uint8_t* out, Rng&) const override {
    for (int64_t i = 0; i < n; ++i) {
      const Half h(x[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
  void decode(const uint8_t* in, int64_t n, float* out) const override {
    for (int64_t i = 0; i < n; ++i) {
      Half h;
      std::memcpy(&h, in + 2 * i, 2);
      out[i] = static_cast<float>(h);
    }
  }

 private:
  std::string name_;
};

// Per chunk: [fp32 scale][chunk payload] (int8).
class ScaledCodec : public Codec {
 public:
  explicit ScaledCodec(int64_t chunk) : chunk_(chunk) {}
  int64_t chunk() const override { return chunk_; }
  int64_t encoded_bytes(int64_t n) const override { return n / chunk_ * chunk_bytes(); }
  void encode(const float* x, int64_t n, uint8_t* out, Rng& rng) const override {
    for (int64_t c = 0; c < n; c += chunk_, out += chunk_bytes()) encode_chunk(x + c, out, rng);
  }
  void decode(const uint8_t* in, int64_t n, float* out) const override {
    for (int64_t c = 0; c < n; c += chunk_, in += chunk_bytes()) {
      float scale;
      if (scale_bytes() == 4) {
        std::memcpy(&scale, in, 4);
      } else {
        c10::BFloat16 b;
        std::memcpy(&b, in, 2);
        scale = static_cast<float>(b);
      }
      decode_chunk(in + scale_bytes(), scale, out + c);
    }
  }

 protected:
  int64_t chunk_bytes() const { return scale_bytes() + payload_bytes(); }
  virtual int64_t scale_bytes() const { return 4; }
  virtual int64_t payload_bytes() const = 0;
  virtual void encode_chunk(const float* x, uint8_t* out, Rng& rng) const = 0;
  virtual void decode_chunk(const uint8_t* in, float scale, float* out) const = 0;
  int64_t chunk_;
};

class Int8Codec : public ScaledCodec {
 public:
  using ScaledCodec::ScaledCodec;
  std::string name() const override { return "int8"; }
  bool unbiased() const override { return true; }

 protected:
  int64_t payload_bytes() const override { return chunk_; }
  void encode_chunk(const float* x, uint8_t* out, Rng& rng) const override {
    float max_abs = 0;
    for (int64_t i = 0; i < chunk_; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    const float scale = max_abs / 127.0f;
    std::memcpy(out, &scale, 4);
    auto* q = reinterpret_cast<int8_t*>(out + 4);
    if (!(scale > 0) || !std::isfinite(scale)) {
      std::fill(q, q + chunk_, int8_t{0});
      return;
    }
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < chunk_; ++i) {
      const float v = std::floor(x[i] * inv + rng.uniform());
      q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
  void decode_chunk(const uint8_t* in, float scale, float* out) const override {
    const auto* q = reinterpret_cast<const int8_t*>(in);
    for (int64_t i = 0; i < chunk_; ++i) out[i] = scale * static_cast<float>(q[i]);
  }
};

// In place, the unnormalised fast Walsh-Hadamard transform of d values (d a power of 2): H v with
// H the d x d Sylvester Hadamard matrix (entries +-1, H H = d I).
void walsh_hadamard(float* v, int64_t d) {
  for (int64_t h = 1; h < d; h <<= 1)
    for (int64_t i = 0; i < d; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

// The random diagonal D of chunk number `index`: d signs from a fixed seed, the same on every
// rank and at every step, so the decoder needs nothing but the chunk's position.
// The flip is an XOR of the float's sign bit (negation, bit for bit): a branch on random bits
// would be mispredicted half the time.
void flip_signs(float* v, int64_t d, uint64_t index) {
  Rng r(mix_seed(0xD1A6, index));
  for (int64_t i = 0; i < d; i += 64) {
    const uint64_t bits = r.next();
    const int64_t n = std::min<int64_t>(64, d - i);
    for (int64_t k = 0; k < n; ++k) {
      uint32_t u;
      std::memcpy(&u, v + i + k, 4);
      u ^= static_cast<uint32_t>((bits >> k) & 1) << 31;
      std::memcpy(v + i + k, &u, 4);
    }
  }
}

// Two-level 1-bit (Seide et al. 2014): per chunk, the mean of its non-negative values and the
// mean magnitude of its negative ones, both bf16, then one sign bit per value. Given the signs,
// those two centroids are the least-squares reconstruction, where one scale mean|x| is not when
// a chunk's values lean one way. Two bf16 scales per 256 cost what one did per 128, and on the
// 2-epoch CNN (with momentum correction, 3 seeds) end 0.9 points above it.
//
// With `rotate`, each chunk is first turned by the orthonormal randomized Hadamard transform
// y = H D x / sqrt(d) (D a fixed random +-1 diagonal per chunk; DRIVE, Vargaftik et al. 2021):
// the rotated values of any chunk are spread like a Gaussian's, whatever the gradient's, so the
// sign keeps the same share of every chunk's energy (2/pi of it for a Gaussian) instead of
// almost none of a chunk whose mass sits in a few values. The decoder turns the two-level
// reconstruction back with x = D H y / sqrt(d). Same bytes; the chunk must be a power of 2.
// Rotated, both levels are then scaled by |y|^2 / |y_2|^2 (y_2 the least-squares two-level
// reconstruction; about pi/2 for a Gaussian chunk), DRIVE's scale: the decoded chunk's
// projection on the original is the original itself, <decoded, x> = |x|^2. The least-squares
// levels shrink what a step sends along the gradient to about 2/pi of it, at each of the two
// compressions of a codec hook, and error feedback repays the rest only steps later; on the
// 2-epoch CNN (3 seeds) the full scale ends +0.3 points from sync where least squares ended -1.4.
class OneBitCodec : public Codec {
 public:
  OneBitCodec(int64_t chunk, bool rotate) : chunk_(chunk), rotate_(rotate) {
    KRAB_CHECK_ARG(!rotate || (chunk & (chunk - 1)) == 0,
                   "comm.chunk must be a power of 2 for onebit with comm.rotation hadamard, got ",
                   chunk);
  }
  std::string name() const override { return "onebit"; }
  int64_t chunk() const override { return chunk_; }
  bool unbiased() const override { return false; }
  int64_t chunk_bytes() const { return 4 + (chunk_ + 7) / 8; }
  int64_t encoded_bytes(int64_t n) const override { return n / chunk_ * chunk_bytes(); }
  void encode(const float* in, int64_t n, uint8_t* out, Rng&) const override {
    std::vector<float> turned(rotate_ ? chunk_ : 0);
    const float norm = 1.0f / std::sqrt(static_cast<float>(chunk_));
    for (int64_t c = 0; c < n; c += chunk_, out += chunk_bytes()) {
      const float* x = in + c;
      if (rotate_) {
        std::copy(x, x + chunk_, turned.begin());
        flip_signs(turned.data(), chunk_, static_cast<uint64_t>(c / chunk_));
        walsh_hadamard(turned.data(), chunk_);
        for (float& v : turned) v *= norm;
        x = turned.data();
      }
      double sp = 0, sn = 0, energy = 0;
      int64_t np = 0;
      for (int64_t i = 0; i < chunk_; ++i) {
        if (x[i] >= 0) {
          sp += x[i];
          ++np;
        } else {
          sn -= x[i];
        }
        energy += double(x[i]) * x[i];
      }
      double level_hi = np ? sp / np : 0.0, level_lo = np < chunk_ ? sn / (chunk_ - np) : 0.0;
      if (rotate_) {  // keep all of the chunk along itself: <decoded, x> = |x|^2
        const double kept = np * level_hi * level_hi + (chunk_ - np) * level_lo * level_lo;
        if (kept > 0) {
          level_hi *= energy / kept;
          level_lo *= energy / kept;
        }
      }
      const c10::BFloat16 hi(static_cast<float>(level_hi));
      const c10::BFloat16 lo(static_cast<float>(level_lo));
      std::memcpy(out, &hi, 2);
      std::memcpy(out + 2, &lo, 2);
      uint8_t* bits = out + 4;
      std::fill(bits, bits + (chunk_ + 7) / 8, uint8_t{0});
      for (int64_t i = 0; i < chunk_; ++i)
        if (x[i] >= 0) bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    }
  }
  void decode(const uint8_t* in, int64_t n, float* out) const override {
    const float norm = 1.0f / std::sqrt(static_cast<float>(chunk_));
    for (int64_t c = 0; c < n; c += chunk_, in += chunk_bytes()) {
      c10::BFloat16 hi, lo;
      std::memcpy(&hi, in, 2);
      std::memcpy(&lo, in + 2, 2);
      const float h = static_cast<float>(hi), l = -static_cast<float>(lo);
      float* y = out + c;
      for (int64_t i = 0; i < chunk_; ++i) y[i] = (in[4 + (i >> 3)] >> (i & 7)) & 1 ? h : l;
      if (rotate_) {
        walsh_hadamard(y, chunk_);
        for (int64_t i = 0; i < chunk_; ++i) y[i] *= norm;
        flip_signs(y, chunk_, static_cast<uint64_t>(c / chunk_));
      }
    }
  }

 private:
  int64_t chunk_;
  bool rotate_;
};

}  // namespace

std::unique_ptr<Codec> make_codec(const std::string& name, int64_t chunk, bool rotate) {
  if (name == "fp16") return std::make_unique<CastCodec<c10::Half>>("fp16");
  if (name == "bf16") return std::make_unique<CastCodec<c10::BFloat16>>("bf16");
  KRAB_CHECK_ARG(chunk >= 0, "comm.chunk must be >= 0, got ", chunk);
  if (name == "int8") return std::make_unique<Int8Codec>(chunk > 0 ? chunk : 256);
  if (name == "onebit") return std::make_unique<OneBitCodec>(chunk > 0 ? chunk : 256, rotate);
  throw InvalidArgument(str_cat("no codec named '", name, "'"));
}

}  // namespace krab::compress
