#include "federated/shamir.h"

#include <sodium.h>

#include <algorithm>
#include <unordered_set>

#include "core/errors.h"
#include "federated/secagg_wire.h"

namespace krab::federated::secagg::shamir {
namespace {

__extension__ typedef unsigned __int128 u128;

constexpr char kShareMagic[5] = "SHR1";

uint64_t field_add(uint64_t a, uint64_t b) {
  uint64_t s = a + b;  // < 2^62, no overflow
  return s >= kPrime ? s - kPrime : s;
}

uint64_t field_sub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kPrime - b; }

// Uniform in [0, p): 61 random bits are uniform in [0, 2^61) and only 2^61 - 1 == p itself
// falls outside, so rejection almost never loops.
uint64_t random_element() {
  for (;;) {
    uint64_t v = 0;
    randombytes_buf(&v, sizeof v);
    v &= kPrime;
    if (v < kPrime) return v;
  }
}

size_t num_chunks(size_t secret_bytes) { return (secret_bytes + kChunkBytes - 1) / kChunkBytes; }

void check_x(uint64_t x, const char* what) {
  KRAB_CHECK_ARG(x != 0 && x < kPrime, what, " x = ", x, " must be in [1, 2^61 - 1)");
}

}  // namespace

uint64_t field_mul(uint64_t a, uint64_t b) {
  const u128 r = static_cast<u128>(a) * b;  // < 2^122
  // 2^61 == 1 (mod p): fold the high bits onto the low ones, twice to get below 2^61 + 2.
  uint64_t s = static_cast<uint64_t>(r & kPrime) + static_cast<uint64_t>(r >> 61);
  s = (s & kPrime) + (s >> 61);
  return s >= kPrime ? s - kPrime : s;
}

uint64_t field_inv(uint64_t a) {
  KRAB_CHECK(a != 0 && a < kPrime, "field_inv of ", a);
  // Fermat: a^(p-2). 61 squarings; the Lagrange weights need a handful per reconstruction.
  uint64_t result = 1, base = a, e = kPrime - 2;
  while (e) {
    if (e & 1) result = field_mul(result, base);
    base = field_mul(base, base);
    e >>= 1;
  }
  return result;
}

std::vector<Share> split(const uint8_t* secret, size_t size, size_t threshold,
                         const std::vector<uint64_t>& xs) {
  wire::ensure_sodium();
  KRAB_CHECK_ARG(size > 0 && size <= kMaxSecretBytes, "shamir::split: secret size ", size,
                 " must be in [1, ", kMaxSecretBytes, "]");
  KRAB_CHECK_ARG(threshold >= 1 && threshold <= xs.size(), "shamir::split: threshold ", threshold,
                 " must be in [1, number of shares = ", xs.size(), "]");
  std::unordered_set<uint64_t> seen;
  for (uint64_t x : xs) {
    check_x(x, "shamir::split: share");
    KRAB_CHECK_ARG(seen.insert(x).second, "shamir::split: duplicate share x = ", x);
  }

  const size_t chunks = num_chunks(size);
  std::vector<Share> shares(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    shares[i].x = xs[i];
    shares[i].secret_length = static_cast<uint32_t>(size);
    shares[i].y.resize(chunks);
  }
  // coeffs[0] is the chunk itself; the rest are fresh per chunk, so chunks are independent.
  std::vector<uint64_t> coeffs(threshold);
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t chunk = 0;
    const size_t begin = c * kChunkBytes, len = std::min(kChunkBytes, size - begin);
    for (size_t b = 0; b < len; ++b) chunk |= static_cast<uint64_t>(secret[begin + b]) << (8 * b);
    coeffs[0] = chunk;
    for (size_t k = 1; k < threshold; ++k) coeffs[k] = random_element();
    for (Share& s : shares) {
      uint64_t acc = 0;  // Horner, highest degree first
      for (size_t k = threshold; k-- > 0;) acc = field_add(field_mul(acc, s.x), coeffs[k]);
      s.y[c] = acc;
    }
  }
  sodium_memzero(coeffs.data(), coeffs.size() * sizeof(uint64_t));
  return shares;
}

std::vector<Share> split(const std::vector<uint8_t>& secret, size_t threshold, size_t num_shares) {
  std::vector<uint64_t> xs(num_shares);
  for (size_t i = 0; i < num_shares; ++i) xs[i] = i + 1;
  return split(secret.data(), secret.size(), threshold, xs);
}

std::vector<uint64_t> lagrange_weights(const std::vector<uint64_t>& xs, uint64_t at) {
  KRAB_CHECK_ARG(at < kPrime, "shamir::lagrange_weights: point ", at, " must be below p");
  // w_i = prod_{j != i} (at - x_j) / (x_i - x_j); at 0 this is Lagrange's weight at 0. One
  // inversion per weight: reconstruction needs t of them per set of holders, not per secret.
  std::vector<uint64_t> w(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    check_x(xs[i], "shamir::lagrange_weights:");
    uint64_t num = 1, den = 1;
    for (size_t j = 0; j < xs.size(); ++j) {
      if (j == i) continue;
      KRAB_CHECK_ARG(xs[j] != xs[i], "shamir::lagrange_weights: duplicate x = ", xs[i]);
      num = field_mul(num, field_sub(at, xs[j]));
      den = field_mul(den, field_sub(xs[i], xs[j]));
    }
    w[i] = field_mul(num, field_inv(den));
  }
  return w;
}

Share share_at(const std::vector<Share>& shares, const std::vector<uint64_t>& weights, uint64_t x) {
  KRAB_CHECK_ARG(!weights.empty() && shares.size() >= weights.size(),
                 "shamir::share_at: ", shares.size(), " shares for ", weights.size(), " weights");
  Share out;
  out.x = x;
  out.secret_length = shares[0].secret_length;
  out.y.assign(shares[0].y.size(), 0);
  for (size_t i = 0; i < weights.size(); ++i) {
    KRAB_CHECK_ARG(shares[i].y.size() == out.y.size(), "shamir::share_at: share x = ", shares[i].x,
                   " has ", shares[i].y.size(), " values, not ", out.y.size());
    for (size_t c = 0; c < out.y.size(); ++c)
      out.y[c] = field_add(out.y[c], field_mul(weights[i], shares[i].y[c]));
  }
  return out;
}

std::vector<uint8_t> combine(const std::vector<Share>& shares, size_t threshold) {
  KRAB_CHECK_ARG(threshold >= 1, "shamir::combine: threshold must be >= 1");
  KRAB_CHECK_ARG(shares.size() >= threshold, "shamir::combine: ", shares.size(),
                 " shares given, the threshold is ", threshold);
  const uint32_t length = shares[0].secret_length;
  KRAB_CHECK_ARG(length > 0 && length <= kMaxSecretBytes, "shamir::combine: secret length ", length,
                 " out of range");
  const size_t chunks = num_chunks(length);
  std::unordered_set<uint64_t> seen;
  for (const Share& s : shares) {
    check_x(s.x, "shamir::combine: share");
    KRAB_CHECK_ARG(seen.insert(s.x).second, "shamir::combine: duplicate share x = ", s.x);
    KRAB_CHECK_ARG(s.secret_length == length && s.y.size() == chunks,
                   "shamir::combine: share x = ", s.x, " is for a ", s.secret_length,
                   "-byte secret with ", s.y.size(), " values; share x = ", shares[0].x, " for a ",
                   length, "-byte one with ", chunks);
    for (uint64_t v : s.y)
      KRAB_CHECK_ARG(v < kPrime, "shamir::combine: share x = ", s.x, " has a value >= p");
  }
  std::vector<uint64_t> xs(threshold);
  for (size_t i = 0; i < threshold; ++i) xs[i] = shares[i].x;
  // The weights depend only on the xs, so they are computed once and reused for every chunk.
  const Share at0 = share_at(shares, lagrange_weights(xs, 0), 0);

  std::vector<uint8_t> secret(length);
  for (size_t c = 0; c < chunks; ++c) {
    const uint64_t chunk = at0.y[c];
    const size_t begin = c * kChunkBytes, len = std::min(kChunkBytes, length - begin);
    // A genuine chunk fits its bytes; shares of different polynomials give a uniform field
    // element, which almost always does not.
    if ((chunk >> (8 * len)) != 0)
      throw CorruptData(str_cat("shamir::combine: the shares are inconsistent (chunk ", c,
                                " does not fit in ", len, " bytes)"));
    for (size_t b = 0; b < len; ++b) secret[begin + b] = static_cast<uint8_t>(chunk >> (8 * b));
  }
  return secret;
}

std::vector<uint8_t> Share::to_bytes() const {
  wire::Writer w(16 + 8 * y.size());
  w.magic(kShareMagic);
  w.u64(x);
  w.u32(secret_length);
  for (uint64_t v : y) w.u64(v);
  return w.take();
}

Share Share::from_bytes(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "shamir share");
  r.magic(kShareMagic);
  Share s;
  s.x = r.u64();
  s.secret_length = r.u32();
  if (s.x == 0 || s.x >= kPrime) r.fail(str_cat("x = ", s.x, " out of range"));
  if (s.secret_length == 0 || s.secret_length > kMaxSecretBytes)
    r.fail(str_cat("secret length ", s.secret_length, " out of range"));
  const size_t chunks = num_chunks(s.secret_length);
  if (r.remaining() != 8 * chunks)
    r.fail(str_cat("expected ", 8 * chunks, " bytes of values, have ", r.remaining()));
  s.y.resize(chunks);
  for (uint64_t& v : s.y) {
    v = r.u64();
    if (v >= kPrime) r.fail("a value is >= p");
  }
  r.finish();
  return s;
}

}  // namespace krab::federated::secagg::shamir
