// Compressors run by DataParallel's CompressionHook (parallel/compression_hook.h) on 3 ranks
// that are threads (loopback Gloo). Independent expectations: the exact fp32 average of the
// ranks' gradients (each rank can compute every rank's gradient: they are seeded by rank and
// step), the error-feedback identity, closed-form traffic.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "compress/compressor.h"
#include "core/errors.h"
#include "parallel/compression_hook.h"
#include "support/gloo_ranks.h"

namespace krab::compress {
namespace {

using parallel::CompressionHook;
using parallel::make_compression_hook;

constexpr int kRanks = 3;

// A bucket as DataParallel lays it out: a 40x30 matrix, a bias of 30 (below min_numel, so
// uncompressed) and a 64x50 matrix.
std::vector<parallel::BucketLayout> layout() {
  return {{{0, {40, 30}}, {1200, {30}}, {1230, {64, 50}}}};
}
constexpr int64_t kBucket = 1200 + 30 + 3200;

at::Tensor gradient(int rank, int64_t step) {
  auto g = at::detail::createCPUGenerator(100 * step + rank + 1);
  return at::randn({kBucket}, g) * (1.0 + rank);
}

at::Tensor true_average(int64_t step) {
  at::Tensor sum = torch::zeros({kBucket});
  for (int q = 0; q < kRanks; ++q) sum += gradient(q, step);
  return sum / kRanks;
}

// The compressed part in packed order: the two matrices.
at::Tensor large_part(const at::Tensor& bucket) {
  return torch::cat({bucket.narrow(0, 0, 1200), bucket.narrow(0, 1230, 3200)});
}

CompressionOptions options(const std::string& name) {
  CompressionOptions o;
  o.kind = parse_compressor(name);
  o.ratio = 0.05;
  o.rank = 2;
  o.chunk = 64;
  o.seed = 11;
  return o;
}

struct RankRun {
  std::vector<at::Tensor> outputs;  // bucket after each step
  at::Tensor sum_sent, sum_grad, residual;
  comm::TrafficStats traffic;
};

// Runs `steps` reductions of each rank's gradient through a fresh hook on every rank.
std::vector<RankRun> run(const CompressionOptions& o, int64_t steps) {
  std::vector<RankRun> runs(kRanks);
  testing::run_gloo_ranks(kRanks, [&](int r, comm::Communicator& c) {
    auto hook = make_compression_hook(o);
    auto* ch = dynamic_cast<CompressionHook*>(hook.get());
    hook->setup(layout());
    RankRun& run = runs[r];
    run.sum_sent = torch::zeros({4400});
    run.sum_grad = torch::zeros({4400});
    for (int64_t s = 0; s < steps; ++s) {
      at::Tensor bucket = gradient(r, s);
      run.sum_grad += large_part(bucket);
      hook->reduce(c, bucket, 0, s)->wait();
      run.outputs.push_back(bucket.clone());
      run.sum_sent += ch->last_sent(0);
    }
    run.residual = ch->residual(0).clone();
    run.traffic = c.traffic();
  });
  return runs;
}

class EveryCompressor : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryCompressor, ErrorFeedbackKeepsEveryGradientAndRanksAgree) {
  const auto runs = run(options(GetParam()), 4);
  for (int r = 0; r < kRanks; ++r) {
    // Nothing is lost, only delayed: sent + residual = sum of true gradients.
    EXPECT_TRUE(torch::allclose(runs[r].sum_sent + runs[r].residual, runs[r].sum_grad, 1e-4, 1e-4))
        << GetParam() << " rank " << r << ": max error "
        << (runs[r].sum_sent + runs[r].residual - runs[r].sum_grad).abs().max().item<float>();
    for (int64_t s = 0; s < 4; ++s) {
      // Every rank ends with the same bits.
      EXPECT_TRUE(torch::equal(runs[r].outputs[s], runs[0].outputs[s]))
          << GetParam() << ": rank " << r << " differs from rank 0 at step " << s;
      // The uncompressed bias is the exact fp32 average.
      EXPECT_TRUE(torch::allclose(runs[r].outputs[s].narrow(0, 1200, 30),
                                  true_average(s).narrow(0, 1200, 30), 1e-5, 1e-6))
          << GetParam() << " bias at step " << s;
    }
  }
  // The compressed result approximates the average: closer to it than zero is.
  const at::Tensor avg = large_part(true_average(0));
  const at::Tensor got = large_part(runs[0].outputs[0]);
  EXPECT_LT((got - avg).norm().item<double>(), avg.norm().item<double>()) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Compress, EveryCompressor,
                         ::testing::Values("fp16", "bf16", "int8", "onebit", "topk", "randomk",
                                           "powersgd"));

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(CompressHooks, RotatedOneBitKeepsErrorFeedbackAndRanksAgree) {
  auto o = options("onebit");
  o.rotation = Rotation::kHadamard;
  const auto runs = run(o, 4);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(torch::allclose(runs[r].sum_sent + runs[r].residual, runs[r].sum_grad, 1e-4, 1e-4))
        << "rank " << r;
    for (int64_t s = 0; s < 4; ++s)
      EXPECT_TRUE(torch::equal(runs[r].outputs[s], runs[0].outputs[s]));
  }
  // Rotated onebit keeps each chunk's full length along itself, so its error is larger than the
  // least-squares codec's, but the first step's result (no residual yet) points the average's
  // way: one Gaussian-like compression has cosine sqrt(2/pi) = 0.80 with its input, the hook's
  // two (each worker's piece, then the averaged piece) about 2/pi = 0.64.
  const at::Tensor avg = large_part(true_average(0));
  const at::Tensor got = large_part(runs[0].outputs[0]);
  const double cosine =
      (got * avg).sum().item<double>() / (got.norm().item<double>() * avg.norm().item<double>());
  EXPECT_NEAR(cosine, 2 / M_PI, 0.08);
}

// randomk sends exactly ceil(ratio n) values, the true average at those positions, and the
// positions are uniform: over 20 steps every position is drawn about ratio of the time.
TEST(CompressHooks, RandomKDrawsExactlyKUniformPositions) {
  auto o = options("randomk");
  o.ratio = 0.3;
  const int64_t n = 4400, k = 1320, steps = 20;
  const auto runs = run(o, steps);
  const at::Tensor first = large_part(runs[0].outputs[0]);
  const at::Tensor picked = first != 0;
  EXPECT_EQ(picked.sum().item<int64_t>(), k);
  EXPECT_TRUE(torch::allclose(first.masked_select(picked),
                              large_part(true_average(0)).masked_select(picked), 1e-5, 1e-6));
  at::Tensor times = torch::zeros({n}, torch::kLong);
  for (int64_t s = 0; s < steps; ++s) {
    const at::Tensor p = large_part(runs[0].outputs[s]) != 0;
    EXPECT_EQ(p.sum().item<int64_t>(), k) << "step " << s;
    times += p.to(torch::kLong);
  }
  // Binomial(20, 0.3) per position: never drawn in 20 steps has probability 0.7^20 = 8e-4
  // (about 3.5 of 4400); the two halves' totals differ by about 130 (one sigma).
  EXPECT_LT((times == 0).sum().item<int64_t>(), 20);
  const int64_t lo = times.narrow(0, 0, n / 2).sum().item<int64_t>();
  const int64_t hi = times.narrow(0, n / 2, n / 2).sum().item<int64_t>();
  EXPECT_LT(std::abs(lo - hi), 700) << lo << " vs " << hi;
}

TEST(CompressHooks, HalfCastsMatchTheAverageToTheirPrecision) {
  for (auto [name, tol] : {std::pair<const char*, double>{"fp16", 2e-3}, {"bf16", 1.6e-2}}) {
    const auto runs = run(options(name), 1);
    EXPECT_LT(rel_error(runs[0].outputs[0], true_average(0)), tol) << name;
  }
}

TEST(CompressHooks, SparseWithRatioOneIsTheAverage) {
  auto o = options("randomk");
  o.ratio = 1;
  EXPECT_LT(rel_error(run(o, 1)[0].outputs[0], true_average(0)), 1e-6) << "randomk";
  o.kind = CompressorKind::kTopK;  // values travel as fp16 relative to the block's largest
  EXPECT_LT(rel_error(run(o, 1)[0].outputs[0], true_average(0)), 2e-3) << "topk";
}

TEST(CompressHooks, TopkSendsTheLargestValues) {
  auto o = options("topk");
  o.ratio = 0.01;  // 12 of the first matrix+second matrix (4400 values, one block) -> 44
  const auto runs = run(o, 1);
  for (int r = 0; r < kRanks; ++r) {
    const at::Tensor g = large_part(gradient(r, 0)).abs();
    const at::Tensor sent = runs[r].sum_sent;  // one step: what was sent
    EXPECT_EQ(sent.ne(0).sum().item<int64_t>(), 44) << "rank " << r;
    // Every sent position is at least as large as every unsent one.
    const float smallest_sent = g.masked_select(sent.ne(0)).min().item<float>();
    const float largest_kept = g.masked_select(sent.eq(0)).max().item<float>();
    EXPECT_GE(smallest_sent, largest_kept) << "rank " << r;
  }
  // The result is non-zero only where some rank sent something.
  at::Tensor any = torch::zeros({4400}, torch::kBool);
  for (int r = 0; r < kRanks; ++r) any |= runs[r].sum_sent.ne(0);
  EXPECT_EQ(
      large_part(runs[0].outputs[0]).ne(0).logical_and(any.logical_not()).sum().item<int64_t>(), 0);
}

TEST(CompressHooks, PowerSgdIsExactOnGradientsOfRankOne) {
  // Every rank's matrix is a b_rᵀ with the same a: the average lies in the span PowerSGD finds.
  auto o = options("powersgd");
  o.rank = 1;
  std::vector<at::Tensor> out(kRanks);
  at::Tensor a = torch::linspace(-1, 1, 40);
  auto bucket_of = [&](int r) {
    at::Tensor b = torch::zeros({kBucket});
    at::Tensor br = torch::arange(30, torch::kFloat).mul(0.1 * (r + 1)).sin();
    b.narrow(0, 0, 1200).copy_(torch::outer(a, br).reshape({-1}));
    return b;
  };
  testing::run_gloo_ranks(kRanks, [&](int r, comm::Communicator& c) {
    auto hook = make_compression_hook(o);
    hook->setup(layout());
    at::Tensor b = bucket_of(r);
    hook->reduce(c, b, 0, 0)->wait();
    out[r] = b;
  });
  at::Tensor avg = (bucket_of(0) + bucket_of(1) + bucket_of(2)) / 3;
  EXPECT_LT(rel_error(out[0].narrow(0, 0, 1200), avg.narrow(0, 0, 1200)), 1e-5);
}

TEST(CompressHooks, WarmupStepsArePlainAllreduce) {
  auto o = options("onebit");
  o.warmup_steps = 2;
  const auto runs = run(o, 3);
  for (int64_t s = 0; s < 2; ++s)
    EXPECT_LT(rel_error(runs[0].outputs[s], true_average(s)), 1e-6) << "warm-up step " << s;
  EXPECT_GT(rel_error(runs[0].outputs[2], true_average(2)), 1e-2) << "compressed after warm-up";
}

// Heavy-ball velocity of the averaged gradients: buf_s = m buf_{s-1} + average(s).
std::vector<at::Tensor> momentum_of_average(double m, int64_t steps) {
  std::vector<at::Tensor> bufs;
  at::Tensor buf = torch::zeros({kBucket});
  for (int64_t s = 0; s < steps; ++s) {
    buf = buf * m + true_average(s);
    bufs.push_back(buf.clone());
  }
  return bufs;
}

TEST(CompressHooks, MomentumCorrectionAveragesTheVelocities) {
  // The average of the workers' velocities is the velocity of the average, so with a codec
  // close to lossless the output follows heavy-ball momentum of the averaged gradients, for
  // the compressed matrices and the uncompressed bias alike, in warm-up and after it.
  auto o = options("fp16");
  o.momentum = 0.5;
  o.warmup_steps = 1;
  const auto runs = run(o, 4);
  const auto bufs = momentum_of_average(0.5, 4);
  EXPECT_LT(rel_error(runs[0].outputs[0], bufs[0]), 1e-6) << "warm-up step";
  for (int64_t s = 1; s < 4; ++s) {
    EXPECT_LT(rel_error(runs[0].outputs[s], bufs[s]), 2e-3) << "step " << s;
    EXPECT_TRUE(torch::allclose(runs[0].outputs[s].narrow(0, 1200, 30), bufs[s].narrow(0, 1200, 30),
                                1e-5, 1e-6))
        << "bias at step " << s;
  }
  // Without the correction the same hook returns the plain average, far from the velocity.
  o.momentum = 0;
  EXPECT_GT(rel_error(run(o, 4)[0].outputs[3], bufs[3]), 0.1);
}

TEST(CompressHooks, SparseMomentumCorrectionClearsTheVelocityWhereItSent) {
  // randomk with ratio 1 sends every value, so factor masking leaves no velocity behind: each
  // step is the plain average (DGC's rule), not the momentum of the averages.
  auto o = options("randomk");
  o.ratio = 1;
  o.momentum = 0.9;
  const auto runs = run(o, 3);
  for (int64_t s = 0; s < 3; ++s)
    EXPECT_LT(rel_error(large_part(runs[0].outputs[s]), large_part(true_average(s))), 1e-6)
        << "step " << s;
  // The uncompressed bias is not masked: it keeps its momentum.
  const auto bufs = momentum_of_average(0.9, 3);
  EXPECT_TRUE(torch::allclose(runs[0].outputs[2].narrow(0, 1200, 30), bufs[2].narrow(0, 1200, 30),
                              1e-5, 1e-6));
}

TEST(CompressHooks, ClippingBoundsEachWorkersCompressedGradient) {
  // randomk with ratio 1 is exact, so the output is the average of the clipped gradients.
  auto o = options("randomk");
  o.ratio = 1;
  o.clip_norm = 1.0;
  const auto runs = run(o, 1);
  at::Tensor want = torch::zeros({4400});
  for (int q = 0; q < kRanks; ++q) {
    at::Tensor g = large_part(gradient(q, 0));
    want += g * std::min(1.0, 1.0 / g.norm().item<double>());
  }
  want /= kRanks;
  EXPECT_LT(rel_error(large_part(runs[0].outputs[0]), want), 1e-5);
  EXPECT_TRUE(torch::allclose(runs[0].outputs[0].narrow(0, 1200, 30),
                              true_average(0).narrow(0, 1200, 30), 1e-5, 1e-6))
      << "the bias is not clipped";
}

TEST(CompressHooks, CodecTrafficIsTheEncodedShareOfARing) {
  // int8, chunk 64: the 4400 compressed values are cut into 3 pieces of 1472 (a multiple of
  // 64); each piece encodes to 23 x (4 + 64) bytes. All-to-all and all-gather each send two
  // pieces per rank; the 30-value bias goes by fp32 all-reduce: 2 (W-1)/W x 120 bytes.
  const auto runs = run(options("int8"), 1);
  const uint64_t piece = 1472 / 64 * (4 + 64);
  for (int r = 0; r < kRanks; ++r) {
    const auto& t = runs[r].traffic;
    EXPECT_EQ(t.bytes_sent[static_cast<int>(comm::OpKind::kAlltoall)], 2 * piece);
    EXPECT_EQ(t.bytes_sent[static_cast<int>(comm::OpKind::kAllgather)], 2 * piece);
    EXPECT_EQ(t.bytes_sent[static_cast<int>(comm::OpKind::kAllreduce)], 2 * 2 * 120 / 3);
  }
}

TEST(CompressHooks, BadOptionsNameTheKey) {
  // Names are checked where they become enums (parse_*), values by validate().
  auto expect_key_from = [](const std::function<void()>& check, const std::string& key) {
    try {
      check();
      ADD_FAILURE() << "accepted bad " << key;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  auto expect_key = [&](CompressionOptions o, const std::string& key) {
    expect_key_from([&] { validate(o); }, key);
  };
  expect_key_from([] { options("gzip"); }, "comm.compression");
  auto o = options("topk");
  o.ratio = 0;
  expect_key(o, "comm.ratio");
  o.ratio = 1.5;
  expect_key(o, "comm.ratio");
  o = options("powersgd");
  o.rank = 0;
  expect_key(o, "comm.rank");
  o = options("int8");
  o.momentum = 1.0;
  expect_key(o, "comm.momentum_correction");
  o.momentum = 0;
  o.clip_norm = -1;
  expect_key(o, "comm.clip_norm");
  expect_key_from([] { parse_rotation("fourier"); }, "comm.rotation");
  o = options("int8");
  o.rotation = Rotation::kHadamard;
  expect_key(o, "comm.rotation");
  o = options("onebit");
  o.rotation = Rotation::kHadamard;
  o.chunk = 96;
  expect_key(o, "comm.chunk");
  EXPECT_EQ(make_compression_hook(options("none")), nullptr);
}

}  // namespace
}  // namespace krab::compress
