// Fixed-point encoding into Z_{2^32}, ChaCha20 mask expansion and X25519 key agreement.
#include "federated/masking.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/errors.h"

namespace krab::federated::secagg {
namespace {

std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Seed seed_of(uint8_t b) {
  Seed s;
  s.fill(b);
  return s;
}

TEST(FixedPoint, EncodeDecodeRoundTripWithinHalfAStep) {
  const FixedPoint fp{1024.0, 4.0};
  const auto x = random_floats(1000, -4.0f, 4.0f, 1);
  const auto back = fp.decode_sum(fp.encode(x), 1);
  ASSERT_EQ(back.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::abs(back[i] - x[i]), 0.5 / 1024 + 1e-6);
  // Negative values are two's complement; clamping happens before scaling.
  const float special[] = {-1.0f, 0.0f, 1.0f, 100.0f, -100.0f};
  const auto enc = fp.encode(special, 5);
  EXPECT_EQ(enc[0], 0xFFFFFC00u);
  EXPECT_EQ(enc[1], 0u);
  EXPECT_EQ(enc[2], 1024u);
  EXPECT_EQ(enc[3], 4096u);
  EXPECT_EQ(static_cast<int32_t>(enc[4]), -4096);
}

TEST(FixedPoint, SumOfManyVectorsDecodesWithinPrecisionThroughWraparound) {
  const size_t n = 50, m = 2000;
  const FixedPoint fp = FixedPoint::for_clients(2.0, n);
  std::vector<uint32_t> acc(m, 0);
  std::vector<double> exact(m, 0.0);
  for (size_t k = 0; k < n; ++k) {
    // Mostly negative updates: the uint32 sum wraps below zero many times.
    const auto x = random_floats(m, -2.0f, 1.0f, static_cast<uint32_t>(100 + k));
    add_to(acc, fp.encode(x));
    for (size_t i = 0; i < m; ++i) exact[i] += x[i];
  }
  // Most sums are negative: as uint32 they sit above 2^31, having wrapped below zero.
  size_t negative = 0;
  for (size_t i = 0; i < m; ++i) negative += acc[i] > 0x80000000u && exact[i] < 0;
  EXPECT_GT(negative, m / 2);
  const auto sum = fp.decode_sum(acc, n);
  double worst = 0;
  for (size_t i = 0; i < m; ++i) worst = std::max(worst, std::abs(sum[i] - exact[i]));
  // n * 0.5 / scale from rounding, plus float32's rounding of a result up to |100|.
  EXPECT_LE(worst, n * 0.5 / fp.scale + 100 * 6e-8);
}

TEST(FixedPoint, ForClientsPicksTheLargestScaleThatCannotOverflow) {
  const FixedPoint fp = FixedPoint::for_clients(1.0, 100);
  EXPECT_EQ(fp.scale, 16777216.0);  // 2^24: 100 * 2^24 < 2^31 <= 100 * 2^25
  EXPECT_EQ(fp.clip, 1.0);
  // The extreme case, exactly: every client at +clip, then every client at -clip.
  for (float v : {1.0f, -1.0f, 5.0f, -5.0f}) {
    std::vector<uint32_t> acc(1, 0);
    for (int k = 0; k < 100; ++k) add_to(acc, fp.encode(&v, 1));
    EXPECT_EQ(static_cast<int32_t>(acc[0]), (v > 0 ? 1 : -1) * 100 * 16777216);
    EXPECT_EQ(fp.decode_sum(acc, 100)[0], v > 0 ? 100.0f : -100.0f);
  }
  // Doubling the scale would wrap: 100 * 2^25 > 2^31 - 1.
  EXPECT_GT(100.0 * std::ceil(1.0 * 2 * fp.scale), 2147483647.0);

  // A clip whose scaled value is not an integer: rounding up must still fit.
  for (size_t n : {1, 3, 7, 1000}) {
    const double clip = 0.7;
    const FixedPoint f = FixedPoint::for_clients(clip, n);
    const double code = std::round(clip * f.scale);
    EXPECT_LE(n * code, 2147483647.0) << n;
    EXPECT_GT(n * std::ceil(clip * 2 * f.scale), 2147483647.0) << n;
    EXPECT_NO_THROW(f.validate(n));
    EXPECT_THROW(f.validate(2 * n + 1), InvalidArgument);
  }
  EXPECT_THROW(FixedPoint::for_clients(0.0, 10), InvalidArgument);
  EXPECT_THROW(FixedPoint::for_clients(-1.0, 10), InvalidArgument);
  EXPECT_THROW(FixedPoint::for_clients(NAN, 10), InvalidArgument);
  EXPECT_THROW(FixedPoint::for_clients(1.0, 0), InvalidArgument);
  EXPECT_THROW(FixedPoint::for_clients(1e9, 10), InvalidArgument);  // scale would be < 1
}

TEST(FixedPoint, RejectsNonFiniteInputsAndOverflowingSums) {
  const FixedPoint fp{256.0, 1.0};
  const float bad[] = {0.5f, NAN};
  EXPECT_THROW(fp.encode(bad, 2), InvalidArgument);
  const float inf[] = {INFINITY};
  EXPECT_THROW(fp.encode(inf, 1), InvalidArgument);
  EXPECT_THROW(fp.decode_sum({0}, 0), InvalidArgument);
  const FixedPoint too_fine{4294967296.0, 1.0};
  EXPECT_THROW(too_fine.encode(bad, 1), InvalidArgument);
}

TEST(Masking, ExpandMaskIsDeterministicAndSeparatesSeedsAndRounds) {
  const auto a = expand_mask(seed_of(1), 7, 5000);
  EXPECT_EQ(a, expand_mask(seed_of(1), 7, 5000));
  const auto prefix = expand_mask(seed_of(1), 7, 1500);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
  const auto other_seed = expand_mask(seed_of(2), 7, 5000);
  const auto other_round = expand_mask(seed_of(1), 8, 5000);
  size_t same_seed = 0, same_round = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_seed += a[i] == other_seed[i];
    same_round += a[i] == other_round[i];
  }
  EXPECT_LE(same_seed, 2u);
  EXPECT_LE(same_round, 2u);
  // Roughly uniform: the mean of 5000 uniform uint32s is 2^31 within a few percent.
  double mean = 0;
  for (uint32_t v : a) mean += v;
  mean /= a.size();
  EXPECT_NEAR(mean / 2147483648.0, 1.0, 0.05);
  EXPECT_TRUE(expand_mask(seed_of(1), 7, 0).empty());
}

TEST(Masking, ApplyMaskMatchesExpandMaskAndCancels) {
  const auto x = random_floats(3000, -1, 1, 3);
  const FixedPoint fp{65536.0, 1.0};
  const auto enc = fp.encode(x);
  auto acc = enc;
  apply_mask(acc, seed_of(9), 4, +1);
  auto expected = enc;
  add_to(expected, expand_mask(seed_of(9), 4, enc.size()));
  EXPECT_EQ(acc, expected);
  apply_mask(acc, seed_of(9), 4, -1);
  EXPECT_EQ(acc, enc);
  subtract_from(expected, expand_mask(seed_of(9), 4, enc.size()));
  EXPECT_EQ(expected, enc);
  EXPECT_THROW(apply_mask(acc, seed_of(9), 4, 0), InvalidArgument);
  std::vector<uint32_t> shorter(10);
  EXPECT_THROW(add_to(acc, shorter), InvalidArgument);
  EXPECT_THROW(subtract_from(acc, shorter), InvalidArgument);
}

TEST(Masking, AddSubtractWrapModTwoToThe32) {
  std::vector<uint32_t> a = {0xFFFFFFFFu, 0u, 5u};
  add_to(a, {1u, 0xFFFFFFFFu, 5u});
  EXPECT_EQ(a, (std::vector<uint32_t>{0u, 0xFFFFFFFFu, 10u}));
  subtract_from(a, {1u, 0xFFFFFFFFu, 11u});
  EXPECT_EQ(a, (std::vector<uint32_t>{0xFFFFFFFFu, 0u, 0xFFFFFFFFu}));
}

TEST(KeyAgreement, BothSidesDeriveTheSameSeedAndOthersDiffer) {
  const KeyPair a = KeyPair::generate(), b = KeyPair::generate(), c = KeyPair::generate();
  EXPECT_NE(a.pk, b.pk);
  const Seed ab = agree(a, b.pk, "ctx"), ba = agree(b, a.pk, "ctx");
  EXPECT_EQ(ab, ba);
  EXPECT_NE(ab, agree(a, c.pk, "ctx"));
  EXPECT_NE(ab, agree(c, b.pk, "ctx"));
  EXPECT_NE(ab, agree(a, b.pk, "other context"));
  EXPECT_EQ(agree(c, a.pk, "ctx"), agree(a, c.pk, "ctx"));
  EXPECT_EQ(KeyPair::from_secret(a.sk).pk, a.pk);
}

TEST(KeyAgreement, LowOrderPeerKeyIsCorrupt) {
  const KeyPair a = KeyPair::generate();
  PublicKey zero{};  // the identity: every product is the all-zero point
  EXPECT_THROW(agree(a, zero, "ctx"), CorruptData);
  PublicKey one{};  // u = 1, a point of order 4
  one[0] = 1;
  EXPECT_THROW(agree(a, one, "ctx"), CorruptData);
}

}  // namespace
}  // namespace krab::federated::secagg
