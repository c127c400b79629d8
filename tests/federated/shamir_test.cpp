// Shamir secret sharing over GF(2^61 - 1): reconstruction from any t shares, refusal with fewer,
// input checks, and the share wire format.
#include "federated/shamir.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "core/errors.h"

namespace krab::federated::secagg::shamir {
namespace {

std::vector<uint8_t> random_secret(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> s(n);
  for (auto& b : s) b = static_cast<uint8_t>(rng());
  return s;
}

TEST(Shamir, FieldArithmetic) {
  EXPECT_EQ(field_mul(kPrime - 1, kPrime - 1), 1u);  // (-1)^2
  EXPECT_EQ(field_mul(uint64_t{1} << 60, 2), 1u);    // 2^61 == 1
  for (uint64_t a : {uint64_t{2}, uint64_t{12345}, kPrime - 2, uint64_t{1} << 40})
    EXPECT_EQ(field_mul(a, field_inv(a)), 1u) << a;
}

TEST(Shamir, RoundTripForSeveralThresholds) {
  const std::pair<size_t, size_t> cases[] = {{1, 1}, {1, 5}, {2, 3}, {3, 5}, {5, 5}, {7, 10}};
  for (const auto& [t, n] : cases) {
    for (size_t len : {1, 7, 8, 32, 33}) {
      const auto secret = random_secret(len, static_cast<uint32_t>(t * 100 + n * 10 + len));
      const auto shares = split(secret, t, n);
      ASSERT_EQ(shares.size(), n);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(shares[i].x, i + 1);
        EXPECT_EQ(shares[i].secret_length, len);
        EXPECT_EQ(shares[i].y.size(), (len + 6) / 7);
      }
      EXPECT_EQ(combine(shares, t), secret) << "t=" << t << " n=" << n << " len=" << len;
      // The last t shares work as well as the first t.
      std::vector<Share> tail(shares.end() - static_cast<std::ptrdiff_t>(t), shares.end());
      EXPECT_EQ(combine(tail, t), secret);
    }
  }
}

TEST(Shamir, EveryThresholdSubsetReconstructsTheSameSecret) {
  const size_t t = 3, n = 6;
  const auto secret = random_secret(32, 7);
  const auto shares = split(secret, t, n);
  int subsets = 0;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b)
      for (size_t c = b + 1; c < n; ++c) {
        EXPECT_EQ(combine({shares[c], shares[a], shares[b]}, t), secret);
        ++subsets;
      }
  EXPECT_EQ(subsets, 20);
}

TEST(Shamir, ArbitraryXCoordinates) {
  const auto secret = random_secret(32, 9);
  const std::vector<uint64_t> xs = {1000, 3, kPrime - 1, 77};
  const auto shares = split(secret.data(), secret.size(), 2, xs);
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(shares[i].x, xs[i]);
  EXPECT_EQ(combine({shares[2], shares[0]}, 2), secret);
}

TEST(Shamir, FewerThanThresholdSharesAreRefusedAndLookRandom) {
  const auto secret = random_secret(32, 11);
  const auto shares = split(secret, 4, 6);
  std::vector<Share> three(shares.begin(), shares.begin() + 3);
  EXPECT_THROW(combine(three, 4), InvalidArgument);
  // Interpolating t - 1 shares as if the threshold were t - 1 gives an unrelated value (with
  // overwhelming probability the chunks do not even fit their bytes).
  bool differs = true;
  try {
    differs = combine(three, 3) != secret;
  } catch (const CorruptData&) {
  }
  EXPECT_TRUE(differs);
  // Splitting the same secret twice gives independent shares: t - 1 of them carry no pattern.
  const auto again = split(secret, 4, 6);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(shares[i].y, again[i].y);
}

TEST(Shamir, InvalidInputsThrow) {
  const auto secret = random_secret(32, 13);
  auto shares = split(secret, 3, 5);
  EXPECT_THROW(combine({shares[0], shares[0], shares[1]}, 3), InvalidArgument);  // duplicate x
  Share zero = shares[2];
  zero.x = 0;
  EXPECT_THROW(combine({shares[0], shares[1], zero}, 3), InvalidArgument);
  Share shorter = shares[2];
  shorter.secret_length = 31;
  EXPECT_THROW(combine({shares[0], shares[1], shorter}, 3), InvalidArgument);
  Share fewer_y = shares[2];
  fewer_y.y.pop_back();
  EXPECT_THROW(combine({shares[0], shares[1], fewer_y}, 3), InvalidArgument);
  EXPECT_THROW(combine({}, 1), InvalidArgument);
  EXPECT_THROW(combine(shares, 0), InvalidArgument);

  EXPECT_THROW(split(secret, 0, 5), InvalidArgument);
  EXPECT_THROW(split(secret, 6, 5), InvalidArgument);
  EXPECT_THROW(split({}, 1, 1), InvalidArgument);
  const std::vector<uint64_t> dup = {1, 2, 2}, has_zero = {0, 1}, too_big = {1, kPrime};
  EXPECT_THROW(split(secret.data(), 32, 2, dup), InvalidArgument);
  EXPECT_THROW(split(secret.data(), 32, 2, has_zero), InvalidArgument);
  EXPECT_THROW(split(secret.data(), 32, 2, too_big), InvalidArgument);
}

TEST(Shamir, MixedSharesOfDifferentSecretsAreDetectedOrDiffer) {
  const auto a = random_secret(32, 15), b = random_secret(32, 16);
  const auto sa = split(a, 2, 3), sb = split(b, 2, 3);
  bool wrong = true;
  try {
    const auto got = combine({sa[0], sb[1]}, 2);
    wrong = got != a && got != b;
  } catch (const CorruptData&) {
  }
  EXPECT_TRUE(wrong);
}

TEST(Shamir, ShareSerializationRoundTrip) {
  const auto secret = random_secret(32, 17);
  const auto shares = split(secret, 3, 4);
  for (const Share& s : shares) {
    const auto bytes = s.to_bytes();
    EXPECT_EQ(bytes.size(), 16u + 8 * 5);
    EXPECT_EQ(Share::from_bytes(bytes), s);
  }
  std::vector<Share> parsed;
  for (const Share& s : shares) parsed.push_back(Share::from_bytes(s.to_bytes()));
  EXPECT_EQ(combine(parsed, 3), secret);
}

TEST(Shamir, TruncatedOrGarbageBytesAreCorrupt) {
  const auto bytes = split(random_secret(32, 19), 2, 2)[0].to_bytes();
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(Share::from_bytes(bytes.data(), n), CorruptData) << n;
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(Share::from_bytes(longer), CorruptData);
  auto bad_magic = bytes;
  bad_magic[0] ^= 1;
  EXPECT_THROW(Share::from_bytes(bad_magic), CorruptData);
  auto zero_x = bytes;
  std::fill(zero_x.begin() + 4, zero_x.begin() + 12, 0);
  EXPECT_THROW(Share::from_bytes(zero_x), CorruptData);
  auto big_y = bytes;
  std::fill(big_y.end() - 8, big_y.end(), 0xff);  // a value >= p
  EXPECT_THROW(Share::from_bytes(big_y), CorruptData);
  auto huge_len = bytes;
  huge_len[12] = huge_len[13] = huge_len[14] = huge_len[15] = 0xff;
  EXPECT_THROW(Share::from_bytes(huge_len), CorruptData);
  std::mt19937 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> garbage(rng() % 80);
    for (auto& b : garbage) b = static_cast<uint8_t>(rng());
    EXPECT_THROW(Share::from_bytes(garbage), CorruptData);
  }
}

}  // namespace
}  // namespace krab::federated::secagg::shamir
