// The arithmetic under secure aggregation (secagg.h): float updates as integers mod 2^32,
// masks that cancel in a sum, and the pairwise key agreement that lets two clients derive the
// same mask without talking to each other.
//
// Fixed point. Masks are uniform in Z_{2^32}, so an update must live there too: each float is
// clamped to [-clip, clip], multiplied by `scale`, rounded to the nearest integer and stored in
// two's complement as a uint32. Sums of such vectors wrap mod 2^32 exactly like the masks do;
// as long as the true integer sum stays inside int32, reading the wrapped sum back as int32 and
// dividing by scale recovers it. FixedPoint::for_clients() picks the largest power-of-two scale
// for which num_clients clipped values cannot leave int32. Precision: rounding costs at most
// 0.5 / scale per value, so a decoded sum of n updates (each within clip) is within
// n * 0.5 / scale of the exact sum of the float inputs, plus the float32 rounding of the result
// (relative 2^-24). E.g. clip 1, 100 clients: scale 2^24, error <= 3e-6 per coordinate.
// Values beyond clip are clamped, not wrapped: clip is part of the contract with the clients.
//
// Masks. expand_mask() stretches a 32-byte seed into n uniform uint32s with ChaCha20 (IETF,
// key = seed, nonce = "kmsk" || round as u64 LE), so the same seed and round give the same mask
// on every machine, and a new round gives an unrelated one from the same seed.
//
// Key agreement. Each client has X25519 key pairs; agree() hashes the shared point with both
// public keys (sorted, so both sides hash the same bytes) and a context string into a 32-byte
// seed with BLAKE2b: client u computing agree(u's pair, pk_v) and client v computing
// agree(v's pair, pk_u) get the same seed, and nobody without one of the secret keys can.
//
// Everything here is a pure function of its inputs except KeyPair::generate() (OS randomness);
// all are thread-safe. Caller mistakes throw krab::InvalidArgument; a peer key that yields the
// all-zero shared point (a low-order point: an attack or garbage) throws krab::CorruptData.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace krab::federated::secagg {

using Seed = std::array<uint8_t, 32>;
using PublicKey = std::array<uint8_t, 32>;
using SecretKey = std::array<uint8_t, 32>;

// ---- fixed point -------------------------------------------------------------------------

struct FixedPoint {
  double scale = 65536.0;  // the float 1.0 encodes as 65536
  double clip = 1.0;       // |values| are clamped to clip before scaling

  // The largest power-of-two scale with num_clients * ceil(clip * scale) < 2^31, i.e. such that
  // num_clients values of +-clip sum to something inside int32 (ceil rather than the exact
  // product because a rounded clip * scale may round up). Throws InvalidArgument if clip is not
  // finite and > 0, num_clients == 0, or the scale would be below 1 (clip * num_clients too
  // large to carry any fraction; shrink the clip).
  static FixedPoint for_clients(double clip, size_t num_clients);

  // Throws InvalidArgument unless scale and clip are finite and > 0 and num_summed values of
  // +-clip cannot overflow int32 (num_summed * ceil(clip * scale) < 2^31).
  void validate(size_t num_summed = 1) const;

  // round(clamp(x[i], -clip, clip) * scale) in two's complement. Throws InvalidArgument on a
  // NaN or infinite x[i] (naming i) or if validate(1) fails.
  std::vector<uint32_t> encode(const float* x, size_t n) const;
  std::vector<uint32_t> encode(const std::vector<float>& x) const {
    return encode(x.data(), x.size());
  }

  // The sum of num_summed encoded vectors (added mod 2^32) back to floats: int32 / scale.
  // Throws InvalidArgument if validate(num_summed) fails — then the sum may have wrapped and
  // the result would be silently wrong.
  std::vector<float> decode_sum(const std::vector<uint32_t>& sum, size_t num_summed) const;
};

// ---- masks -------------------------------------------------------------------------------

// n uniform uint32s from ChaCha20(seed, nonce from round). Deterministic in (seed, round, n); a
// shorter n gives a prefix of a longer one. n must be below 2^36 (ChaCha20-IETF's 256 GiB).
std::vector<uint32_t> expand_mask(const Seed& seed, uint64_t round, size_t n);

// acc += expand_mask(seed, round, acc.size()) (sign +1) or acc -= it (sign -1), mod 2^32,
// without materialising the mask: what the protocol does once per peer.
void apply_mask(std::vector<uint32_t>& acc, const Seed& seed, uint64_t round, int sign);

// acc[i] += v[i] and acc[i] -= v[i] mod 2^32. Throws InvalidArgument on a size mismatch.
void add_to(std::vector<uint32_t>& acc, const std::vector<uint32_t>& v);
void subtract_from(std::vector<uint32_t>& acc, const std::vector<uint32_t>& v);

// ---- key agreement -----------------------------------------------------------------------

struct KeyPair {
  PublicKey pk{};
  SecretKey sk{};

  // A fresh pair from the OS CSPRNG (crypto_box_keypair).
  static KeyPair generate();
  // The pair with this secret key: pk = X25519 base-point multiple of sk. Used to check that a
  // reconstructed secret key belongs to the advertised public key.
  static KeyPair from_secret(const SecretKey& sk);
};

// BLAKE2b-256(X25519(mine.sk, theirs) || min(mine.pk, theirs) || max(mine.pk, theirs) ||
// context), the keys ordered bytewise. `mine.pk` must be mine.sk's public key (not checked:
// it costs a scalar multiplication). Symmetric: agree(a, b.pk, c) == agree(b, a.pk, c).
// Throws CorruptData if the shared point is all zeros (theirs is a low-order point).
Seed agree(const KeyPair& mine, const PublicKey& theirs, std::string_view context);

}  // namespace krab::federated::secagg
