// The Compressor protocol (compress/compressor.h) driven without a network: three workers in
// one thread, their payloads combined in memory as aggregation() says. This is what a layer
// other than DataParallel (a parameter server) does with a Compressor; the collectives version
// is parallel::CompressionHook (hooks_test.cpp).
#include "compress/compressor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace krab::compress {
namespace {

constexpr int kWorkers = 3;
const std::vector<Segment> kSegments{{0, 1200, 40, 30}, {1200, 3200, 64, 50}};
constexpr int64_t kNumel = 4400;

at::Tensor value(int worker, int64_t step) {
  auto g = at::detail::createCPUGenerator(1000 * step + worker + 7);
  return at::randn({kNumel}, g) * (1.0 + worker);
}

// Combines the workers' payloads of one round as the protocol says; returns what each decodes.
std::vector<at::Tensor> combine(std::vector<std::unique_ptr<Compressor>>& cs,
                                const std::vector<Encoded>& enc, int64_t step) {
  std::vector<at::Tensor> payloads;
  for (const Encoded& e : enc) payloads.push_back(e.payload);
  switch (cs[0]->aggregation()) {
    case Aggregation::kSum: {
      at::Tensor avg = torch::stack(payloads).sum(0) / kWorkers;
      return std::vector<at::Tensor>(kWorkers, avg);
    }
    case Aggregation::kGather:
      return std::vector<at::Tensor>(kWorkers, torch::cat(payloads));
    case Aggregation::kReencode: {
      std::vector<at::Tensor> pieces;
      for (int j = 0; j < kWorkers; ++j) {
        std::vector<at::Tensor> received;
        for (const at::Tensor& p : payloads) received.push_back(p.chunk(kWorkers)[j]);
        pieces.push_back(cs[j]->reencode({0, step, j, kWorkers}, torch::cat(received)));
      }
      return std::vector<at::Tensor>(kWorkers, torch::cat(pieces));
    }
  }
  return {};
}

// One step on every worker; returns each worker's decoded result.
std::vector<at::Tensor> step(std::vector<std::unique_ptr<Compressor>>& cs, int64_t s) {
  std::vector<at::Tensor> xs;
  for (int w = 0; w < kWorkers; ++w) {
    xs.push_back(value(w, s));
    cs[w]->begin({0, s, w, kWorkers}, xs[w]);
  }
  for (int64_t round = 0; round < cs[0]->rounds(); ++round) {
    std::vector<Encoded> enc;
    for (int w = 0; w < kWorkers; ++w)
      enc.push_back(cs[w]->encode({0, s, w, kWorkers}, round, xs[w]));
    const auto combined = combine(cs, enc, s);
    for (int w = 0; w < kWorkers; ++w)
      cs[w]->decode({0, s, w, kWorkers}, round, combined[w].clone(), xs[w]);
  }
  for (int w = 0; w < kWorkers; ++w) cs[w]->end({0, s, w, kWorkers});
  return xs;
}

class EveryKind : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryKind, WorkersAgreeAndErrorFeedbackKeepsEverything) {
  CompressionOptions o;
  o.kind = parse_compressor(GetParam());
  o.ratio = 0.05;
  o.rank = 2;
  o.chunk = 64;
  o.seed = 5;
  std::vector<std::unique_ptr<Compressor>> cs;
  for (int w = 0; w < kWorkers; ++w) {
    cs.push_back(make_compressor(o));
    cs.back()->setup({kSegments});
  }
  std::vector<at::Tensor> sum_sent(kWorkers, torch::zeros({kNumel}));
  std::vector<at::Tensor> sum_value(kWorkers, torch::zeros({kNumel}));
  for (int64_t s = 0; s < 3; ++s) {
    const auto xs = step(cs, s);
    at::Tensor avg = torch::zeros({kNumel});
    for (int w = 0; w < kWorkers; ++w) {
      EXPECT_TRUE(torch::equal(xs[w], xs[0])) << GetParam() << " worker " << w << " step " << s;
      sum_sent[w] = sum_sent[w] + cs[w]->last_sent(0);
      sum_value[w] = sum_value[w] + value(w, s);
      avg += value(w, s) / kWorkers;
    }
    if (s == 0) {  // no residual yet: the result approximates the average
      EXPECT_LT((xs[0] - avg).norm().item<double>(), avg.norm().item<double>()) << GetParam();
    }
  }
  for (int w = 0; w < kWorkers; ++w)
    EXPECT_TRUE(torch::allclose(sum_sent[w] + cs[w]->residual(0), sum_value[w], 1e-4, 1e-4))
        << GetParam() << " worker " << w;
}

INSTANTIATE_TEST_SUITE_P(Compress, EveryKind,
                         ::testing::Values("fp16", "bf16", "int8", "onebit", "topk", "randomk",
                                           "powersgd"));

TEST(Compressor, PayloadsSayHowTheyCombine) {
  CompressionOptions o;
  const std::vector<std::pair<std::string, Aggregation>> kinds{{"fp16", Aggregation::kReencode},
                                                               {"onebit", Aggregation::kReencode},
                                                               {"topk", Aggregation::kGather},
                                                               {"randomk", Aggregation::kSum},
                                                               {"powersgd", Aggregation::kSum}};
  for (const auto& [name, how] : kinds) {
    o.kind = parse_compressor(name);
    const auto c = make_compressor(o);
    EXPECT_EQ(c->aggregation(), how) << name;
    EXPECT_EQ(c->summable(), how == Aggregation::kSum) << name;
  }
  o.kind = CompressorKind::kNone;
  EXPECT_EQ(make_compressor(o), nullptr);
}

TEST(Compressor, KindsAndRotationsRoundTripTheirNames) {
  EXPECT_EQ(kind_name(parse_compressor("none")), "none");
  for (const std::string& name : compressor_names())
    EXPECT_EQ(kind_name(parse_compressor(name)), name);
  EXPECT_EQ(parse_rotation("hadamard"), Rotation::kHadamard);
  EXPECT_EQ(rotation_name(Rotation::kNone), "none");
}

}  // namespace
}  // namespace krab::compress
