#include "federated/masking.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/errors.h"
#include "federated/secagg_wire.h"

namespace krab::federated::secagg {
namespace {

constexpr uint64_t kInt32Limit = (uint64_t{1} << 31) - 1;  // the largest |int32 sum| we allow

// The largest integer an encoded value can have: round(clip * scale) <= ceil(clip * scale).
double max_code(const FixedPoint& fp) { return std::ceil(fp.clip * fp.scale); }

bool fits(double clip, double scale, size_t num_summed) {
  const double c = std::ceil(clip * scale);
  return std::isfinite(c) && c <= static_cast<double>(kInt32Limit / num_summed);
}

// Keystream in 4 KiB pieces (64 ChaCha20 blocks, so piece k starts at block counter 64 k):
// apply_mask then needs no heap buffer and stays in L1, and expand_mask shares the code so the
// two cannot disagree.
constexpr size_t kPieceWords = 1024;
constexpr size_t kPieceBlocks = kPieceWords * 4 / 64;

template <typename Fn>
void for_each_piece(const Seed& seed, uint64_t round, size_t n, Fn&& fn) {
  wire::ensure_sodium();
  KRAB_CHECK_ARG(n < (size_t{1} << 36), "expand_mask: n = ", n, " exceeds ChaCha20's 2^36 words");
  static const uint8_t kZeros[kPieceWords * 4] = {};
  uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {'k', 'm', 's', 'k'};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(round >> (8 * i));
  uint8_t bytes[kPieceWords * 4];
  uint32_t words[kPieceWords];
  for (size_t start = 0, piece = 0; start < n; start += kPieceWords, ++piece) {
    const size_t len = std::min(kPieceWords, n - start);
    crypto_stream_chacha20_ietf_xor_ic(bytes, kZeros, len * 4, nonce,
                                       static_cast<uint32_t>(piece * kPieceBlocks), seed.data());
    // Little-endian words whatever the host's byte order, so masks agree across machines.
    for (size_t i = 0; i < len; ++i)
      words[i] = static_cast<uint32_t>(bytes[4 * i]) |
                 static_cast<uint32_t>(bytes[4 * i + 1]) << 8 |
                 static_cast<uint32_t>(bytes[4 * i + 2]) << 16 |
                 static_cast<uint32_t>(bytes[4 * i + 3]) << 24;
    fn(start, words, len);
  }
  sodium_memzero(bytes, sizeof bytes);
  sodium_memzero(words, sizeof words);
}

}  // namespace

// ---- fixed point -------------------------------------------------------------------------

FixedPoint FixedPoint::for_clients(double clip, size_t num_clients) {
  KRAB_CHECK_ARG(std::isfinite(clip) && clip > 0, "FixedPoint::for_clients: clip = ", clip,
                 " must be finite and > 0");
  KRAB_CHECK_ARG(num_clients >= 1, "FixedPoint::for_clients: num_clients must be >= 1");
  // Start from the real-valued bound's exponent, then walk to the exact power of two: log2 is
  // only a guess near the boundary, and ceil() can move the answer by one.
  const double bound = static_cast<double>(kInt32Limit) / (static_cast<double>(num_clients) * clip);
  const double guess = std::floor(std::log2(bound));  // may be +inf for a denormal clip
  int k = std::isfinite(guess) ? static_cast<int>(std::clamp(guess, -1100.0, 1023.0)) : 1023;
  while (k > -1100 && !fits(clip, std::ldexp(1.0, k), num_clients)) --k;
  while (k < 1023 && fits(clip, std::ldexp(1.0, k + 1), num_clients)) ++k;
  const double scale = std::ldexp(1.0, k);
  KRAB_CHECK_ARG(scale >= 1.0 && fits(clip, scale, num_clients), "FixedPoint::for_clients: clip ",
                 clip, " x ", num_clients, " clients leaves no room in int32 for a scale >= 1",
                 " (use a clip below ", static_cast<double>(kInt32Limit) / num_clients, ")");
  return FixedPoint{scale, clip};
}

void FixedPoint::validate(size_t num_summed) const {
  KRAB_CHECK_ARG(std::isfinite(scale) && scale > 0, "FixedPoint: scale = ", scale,
                 " must be finite and > 0");
  KRAB_CHECK_ARG(std::isfinite(clip) && clip > 0, "FixedPoint: clip = ", clip,
                 " must be finite and > 0");
  KRAB_CHECK_ARG(num_summed >= 1, "FixedPoint: num_summed must be >= 1");
  KRAB_CHECK_ARG(fits(clip, scale, num_summed), "FixedPoint: ", num_summed, " values of clip ",
                 clip, " at scale ", scale, " (", max_code(*this),
                 " each) can overflow int32; use FixedPoint::for_clients(clip, ", num_summed, ")");
}

std::vector<uint32_t> FixedPoint::encode(const float* x, size_t n) const {
  validate(1);
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    KRAB_CHECK_ARG(std::isfinite(x[i]), "FixedPoint::encode: x[", i, "] = ", x[i],
                   " is not finite");
    const double c = std::clamp(static_cast<double>(x[i]), -clip, clip);
    // Two's complement by way of int64: the conversion to uint32 is then defined (mod 2^32).
    out[i] = static_cast<uint32_t>(std::llround(c * scale));
  }
  return out;
}

std::vector<float> FixedPoint::decode_sum(const std::vector<uint32_t>& sum,
                                          size_t num_summed) const {
  validate(num_summed);
  std::vector<float> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i)
    out[i] = static_cast<float>(static_cast<double>(static_cast<int32_t>(sum[i])) / scale);
  return out;
}

// ---- masks -------------------------------------------------------------------------------

std::vector<uint32_t> expand_mask(const Seed& seed, uint64_t round, size_t n) {
  std::vector<uint32_t> out(n);
  for_each_piece(seed, round, n, [&](size_t start, const uint32_t* w, size_t len) {
    std::memcpy(out.data() + start, w, len * sizeof(uint32_t));
  });
  return out;
}

void apply_mask(std::vector<uint32_t>& acc, const Seed& seed, uint64_t round, int sign) {
  KRAB_CHECK_ARG(sign == 1 || sign == -1, "apply_mask: sign = ", sign, " must be +1 or -1");
  uint32_t* a = acc.data();
  if (sign > 0) {
    for_each_piece(seed, round, acc.size(), [&](size_t start, const uint32_t* w, size_t len) {
      for (size_t i = 0; i < len; ++i) a[start + i] += w[i];
    });
  } else {
    for_each_piece(seed, round, acc.size(), [&](size_t start, const uint32_t* w, size_t len) {
      for (size_t i = 0; i < len; ++i) a[start + i] -= w[i];
    });
  }
}

void add_to(std::vector<uint32_t>& acc, const std::vector<uint32_t>& v) {
  KRAB_CHECK_ARG(acc.size() == v.size(), "add_to: sizes differ (", acc.size(), " vs ", v.size(),
                 ")");
  for (size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
}

void subtract_from(std::vector<uint32_t>& acc, const std::vector<uint32_t>& v) {
  KRAB_CHECK_ARG(acc.size() == v.size(), "subtract_from: sizes differ (", acc.size(), " vs ",
                 v.size(), ")");
  for (size_t i = 0; i < v.size(); ++i) acc[i] -= v[i];
}

// ---- key agreement -----------------------------------------------------------------------

KeyPair KeyPair::generate() {
  wire::ensure_sodium();
  static_assert(crypto_box_PUBLICKEYBYTES == 32 && crypto_box_SECRETKEYBYTES == 32);
  KeyPair kp;
  if (crypto_box_keypair(kp.pk.data(), kp.sk.data()) != 0)
    throw Error("secagg: crypto_box_keypair failed");
  return kp;
}

KeyPair KeyPair::from_secret(const SecretKey& sk) {
  wire::ensure_sodium();
  KeyPair kp;
  kp.sk = sk;
  if (crypto_scalarmult_base(kp.pk.data(), sk.data()) != 0)
    throw CorruptData("secagg: secret key maps to the identity point");
  return kp;
}

Seed agree(const KeyPair& mine, const PublicKey& theirs, std::string_view context) {
  wire::ensure_sodium();
  static_assert(crypto_scalarmult_BYTES == 32 && crypto_generichash_BYTES == 32);
  uint8_t shared[crypto_scalarmult_BYTES];
  // libsodium returns -1 when the result is all zeros, i.e. `theirs` has small order: the
  // "shared secret" would be public, so the peer's key is rejected rather than used.
  if (crypto_scalarmult(shared, mine.sk.data(), theirs.data()) != 0)
    throw CorruptData("secagg: peer public key is a low-order point (all-zero shared secret)");
  const bool mine_first = std::memcmp(mine.pk.data(), theirs.data(), 32) < 0;
  const PublicKey& lo = mine_first ? mine.pk : theirs;
  const PublicKey& hi = mine_first ? theirs : mine.pk;
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, crypto_generichash_BYTES);
  crypto_generichash_update(&st, shared, sizeof shared);
  crypto_generichash_update(&st, lo.data(), lo.size());
  crypto_generichash_update(&st, hi.data(), hi.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(context.data()), context.size());
  Seed seed;
  crypto_generichash_final(&st, seed.data(), seed.size());
  sodium_memzero(shared, sizeof shared);
  sodium_memzero(&st, sizeof st);
  return seed;
}

}  // namespace krab::federated::secagg
