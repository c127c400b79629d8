// Shamir secret sharing over the prime field GF(p), p = 2^61 - 1 (a Mersenne prime, so a
// product reduces with two shifts and an add).
//
// A secret of any length is cut into 7-byte little-endian chunks; each chunk is a field element
// below 2^56 < p and gets its own random polynomial of degree threshold - 1 whose constant term
// is the chunk. A share is the point x (the holder's index, 1 <= x < p) and the value of every
// chunk's polynomial at x. Any `threshold` shares determine the polynomials, hence the secret
// (Lagrange interpolation at 0); any threshold - 1 shares are uniformly distributed whatever the
// secret, so they reveal nothing about it beyond its length.
//
// In secure aggregation (secagg.h) x is the client id of the share's holder, and the secrets are
// 32-byte keys and seeds: a share is 4 + 8 + 4 + 5 * 8 = 56 bytes on the wire.
//
// Randomness comes from libsodium's randombytes (the OS CSPRNG). The functions are thread-safe
// (they keep no state). Caller mistakes throw krab::InvalidArgument naming the argument; a
// share that fails to parse throws krab::CorruptData.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace krab::federated::secagg::shamir {

// The field modulus 2^61 - 1.
inline constexpr uint64_t kPrime = (uint64_t{1} << 61) - 1;
// Secret bytes per field element: 7 bytes < 2^56 < p, so every chunk is a field element.
inline constexpr size_t kChunkBytes = 7;
// The longest secret split() accepts (and from_bytes() believes): 1 MiB, far above the 32-byte
// keys secagg shares, low enough that a forged length cannot make anyone allocate much.
inline constexpr size_t kMaxSecretBytes = size_t{1} << 20;

struct Share {
  uint64_t x = 0;              // the evaluation point, 1 <= x < kPrime
  uint32_t secret_length = 0;  // bytes in the secret
  std::vector<uint64_t> y;     // ceil(secret_length / 7) field elements, each < kPrime

  // Wire format (little-endian): "SHR1", x u64, secret_length u32, then the y values as u64;
  // 16 + 8 * ceil(secret_length / 7) bytes.
  std::vector<uint8_t> to_bytes() const;
  // Exactly the bytes to_bytes() wrote. Throws CorruptData on a bad magic, a truncated or
  // oversized buffer, x == 0 or >= p, a y value >= p, or a secret longer than kMaxSecretBytes.
  static Share from_bytes(const uint8_t* data, size_t size);
  static Share from_bytes(const std::vector<uint8_t>& bytes) {
    return from_bytes(bytes.data(), bytes.size());
  }

  bool operator==(const Share& o) const {
    return x == o.x && secret_length == o.secret_length && y == o.y;
  }
};

// Splits `secret` (0 < size <= kMaxSecretBytes) into one share per entry of `xs`, in that order,
// any `threshold` of which reconstruct it. Requires 1 <= threshold <= xs.size() and the xs
// distinct with 1 <= x < kPrime. threshold = 1 gives every holder the secret itself (a constant
// polynomial); threshold = xs.size() needs every share.
std::vector<Share> split(const uint8_t* secret, size_t size, size_t threshold,
                         const std::vector<uint64_t>& xs);
// The same with x = 1, 2, ..., num_shares.
std::vector<Share> split(const std::vector<uint8_t>& secret, size_t threshold, size_t num_shares);

// Reconstructs the secret from at least `threshold` shares (it interpolates through the first
// `threshold` of them; extra shares are checked for shape but otherwise unused: share_at() is
// how a caller checks them). Throws
// InvalidArgument if there are fewer than threshold (>= 1) shares, two share the same x, some
// x is 0 or >= p, or the shares disagree on the secret length or their y count. Shares of
// different secrets, or damaged ones, reconstruct garbage — detected only when a chunk comes
// out too large for its bytes (CorruptData), so callers that can verify the secret should.
std::vector<uint8_t> combine(const std::vector<Share>& shares, size_t threshold);

// The Lagrange weights w_i with P(at) = sum_i w_i P(xs[i]) for every polynomial P of degree
// below xs.size(). The xs must be distinct and in [1, p), `at` below p (InvalidArgument).
// combine() uses the weights at 0; a caller that checks many secrets' shares from the same
// holders computes them once.
std::vector<uint64_t> lagrange_weights(const std::vector<uint64_t>& xs, uint64_t at);

// The share holder `x` would hold of the secret whose polynomials pass through the first
// weights.size() of `shares`, given weights = lagrange_weights(their xs, x). A share that
// differs from share_at(...) of t shares that reconstruct the secret correctly is a bad one.
// InvalidArgument when there are fewer shares than weights or their value counts differ.
Share share_at(const std::vector<Share>& shares, const std::vector<uint64_t>& weights, uint64_t x);

// Field arithmetic, exposed for the tests. Inputs must be < kPrime.
uint64_t field_mul(uint64_t a, uint64_t b);
uint64_t field_inv(uint64_t a);  // a != 0

}  // namespace krab::federated::secagg::shamir
