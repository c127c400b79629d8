// The memory and traffic model of ZeRO (parallel/zero/memory_model.h) against closed forms
// written out here, independently of the implementation: the issue's formulas for Adam, their
// SGD analogues, world size 1, padding, and the wire bytes of each stage.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/traffic.h"
#include "core/errors.h"
#include "engine/shard_layout.h"
#include "parallel/zero/memory_model.h"

namespace krab::parallel::zero {
namespace {

using comm::OpKind;

// `units` equal non-root units of `each` elements and an empty root.
MemoryInputs equal_units(int64_t units, int64_t each, int world, int stage) {
  MemoryInputs in;
  in.unit_numel.assign(static_cast<size_t>(units) + 1, each);
  in.unit_numel[0] = 0;
  in.world_size = world;
  in.stage = stage;
  return in;
}

// The issue's model state in bytes for fp32 parameters and gradients, k optimizer values per
// parameter, no padding. Written independently of the implementation.
double issue_bytes(int stage, double psi, double n, double k) {
  switch (stage) {
    case 0:
      return 4 * psi + 4 * psi + 4 * k * psi;
    case 1:
      return 4 * psi + 4 * psi + 4 * k * psi / n;
    case 2:
      return 4 * psi + (4 + 4 * k) * psi / n;
    default:
      return (8 + 4 * k) * psi / n;
  }
}

TEST(ZeroMemoryModel, AdamMatchesTheIssueFormulas) {
  // Units of 16·N·8 elements: whole multiples of N·A, so no padding.
  for (int n : {1, 2, 3, 4, 8}) {
    for (int64_t units : {1, 4, 24}) {
      const int64_t each = 16 * n * 8;
      const double psi = static_cast<double>(units * each);
      for (int stage = 0; stage <= 3; ++stage) {
        MemoryInputs in = equal_units(units, each, n, stage);
        const MemoryPrediction m = predict_memory(in);
        // The issue's literal forms for Adam.
        const double expected[] = {16 * psi, 4 * psi + 4 * psi + 8 * psi / n,
                                   4 * psi + 12 * psi / n, 16 * psi / n};
        EXPECT_EQ(static_cast<double>(m.model_state()), expected[stage])
            << "stage " << stage << " N " << n << " units " << units;
        in.optimizer = OptimizerKind::kAdamW;
        EXPECT_EQ(predict_memory(in).model_state(), m.model_state()) << "AdamW = Adam";
      }
    }
  }
}

TEST(ZeroMemoryModel, SgdVariantsAndAmsgrad) {
  const int n = 4;
  const int64_t units = 6, each = 16 * n * 5;
  const double psi = static_cast<double>(units * each);
  struct Case {
    OptimizerKind kind;
    bool amsgrad;
    double k;
  };
  for (const Case& c :
       {Case{OptimizerKind::kSgd, false, 0}, Case{OptimizerKind::kSgdMomentum, false, 1},
        Case{OptimizerKind::kAdam, true, 3}, Case{OptimizerKind::kAdamW, true, 3}}) {
    for (int stage = 0; stage <= 3; ++stage) {
      MemoryInputs in = equal_units(units, each, n, stage);
      in.optimizer = c.kind;
      in.amsgrad = c.amsgrad;
      EXPECT_EQ(static_cast<double>(predict_memory(in).model_state()),
                issue_bytes(stage, psi, n, c.k))
          << "stage " << stage << " k " << c.k;
    }
  }
  // amsgrad means nothing to SGD.
  EXPECT_EQ(optimizer_values_per_param(OptimizerKind::kSgdMomentum, true), 1);
}

TEST(ZeroMemoryModel, WorldOfOneHoldsStageZerosModelState) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kSgdMomentum, OptimizerKind::kAdam,
                             OptimizerKind::kAdamW}) {
    MemoryInputs in;
    in.unit_numel = {48, 1024, 4096, 160};  // multiples of A = 16: no padding at N = 1
    in.optimizer = kind;
    in.world_size = 1;
    in.stage = 0;
    const int64_t stage0 = predict_memory(in).model_state();
    for (int stage = 1; stage <= 3; ++stage) {
      in.stage = stage;
      EXPECT_EQ(predict_memory(in).model_state(), stage0) << "stage " << stage;
    }
  }
}

// The prediction pads each unit exactly as plan_layout lays it out (one rounding rule).
TEST(ZeroMemoryModel, PaddingIsTheLayouts) {
  const std::vector<int64_t> numel = {0, 1, 15, 17, 1000, 12345, 777, 65537, 3};
  std::vector<engine::UnitParams> units;
  for (size_t u = 0; u < numel.size(); ++u)
    units.push_back({u == 0 ? "" : str_cat("u", u), {{str_cat("p", u), {numel[u]}}}});
  for (int n : {1, 2, 3, 7, 8})
    for (int64_t a : {1, 16, 256}) {
      const engine::ShardLayout layout = engine::plan_layout(units, n, a);
      MemoryInputs in;
      in.unit_numel = numel;
      in.world_size = n;
      in.alignment = a;
      in.stage = 1;
      in.optimizer = OptimizerKind::kSgdMomentum;
      int64_t padded = 0;
      for (int u = 0; u < layout.num_units(); ++u) {
        EXPECT_EQ(padded_numel(numel[u], n, a), layout.unit(u).padded);
        padded += layout.unit(u).padded;
      }
      EXPECT_EQ(predict_memory(in).params, 4 * padded) << n << " ranks, alignment " << a;
      EXPECT_EQ(predict_memory(in).optimizer, 4 * padded / n);
    }
}

TEST(ZeroMemoryModel, PaddingIsBounded) {
  const std::vector<int64_t> numel = {0, 1, 15, 17, 1000, 12345, 777, 65537, 3};
  const int64_t units = static_cast<int64_t>(numel.size());
  int64_t psi = 0;
  for (int64_t x : numel) psi += x;
  for (int n : {1, 2, 3, 7, 8}) {
    for (int64_t a : {1, 16, 256}) {
      int64_t psi_p = 0;
      for (int64_t x : numel) {
        const int64_t p = padded_numel(x, n, a);
        EXPECT_EQ(p % (n * a), 0);
        EXPECT_GE(p, x);
        EXPECT_LT(p - x, n * a);
        psi_p += p;
      }
      MemoryInputs in;
      in.unit_numel = numel;
      in.world_size = n;
      in.alignment = a;
      in.stage = 3;
      // 16Ψp/N − 16Ψ/N is under 16 bytes per unit per alignment element, and never negative.
      const int64_t s3 = predict_memory(in).model_state();
      EXPECT_EQ(s3, 16 * psi_p / n);
      EXPECT_GE(s3 * n, 16 * psi);
      EXPECT_LT(s3 - 16 * psi / n, 16 * units * a + 16);
      in.stage = 2;
      const int64_t s2 = predict_memory(in).model_state();
      EXPECT_GE(s2, 4 * psi + 12 * psi / n);
      EXPECT_LT(s2 - (4 * psi + 12 * psi / n), 4 * units * n * a + 12 * units * a + 12);
      in.stage = 0;  // stage 0 has no flats: exact whatever the alignment
      EXPECT_EQ(predict_memory(in).model_state(), 16 * psi);
    }
  }
}

TEST(ZeroMemoryModel, StagesOrderAndWorkingSets) {
  MemoryInputs in = equal_units(12, 1 << 20, 4, 0);  // 12 units of 4 MiB fp32
  in.unit_numel[0] = 1 << 18;
  in.bucket_bytes = 1 << 20;
  int64_t prev_state = INT64_MAX, prev_resident = INT64_MAX;
  for (int stage = 0; stage <= 3; ++stage) {
    in.stage = stage;
    const MemoryPrediction m = predict_memory(in);
    EXPECT_LE(m.model_state(), prev_state) << "stage " << stage;
    EXPECT_LE(m.resident(), prev_resident) << "stage " << stage;
    prev_state = m.model_state();
    prev_resident = m.resident();
  }
  const int64_t psi = 12 * (1 << 20) + (1 << 18);
  in.stage = 0;
  EXPECT_EQ(predict_memory(in).working_set, 4 * psi) << "DataParallel's bucket mirror";
  // Stage 1: grad shards + two buckets of at most one unit (units exceed the 1 MiB cap).
  in.stage = 1;
  EXPECT_EQ(predict_memory(in).working_set, 4 * psi / 4 + 2 * 4 * (1 << 20));
  // Stage 3: root flat and grad, 1 + prefetch units, one unit's grad and bucket.
  in.stage = 3;
  in.prefetch = 2;
  EXPECT_EQ(predict_memory(in).working_set, 8 * (1 << 18) + 4 * 3 * (1 << 20) + 8 * (1 << 20));
}

TEST(ZeroMemoryModel, Bf16ErrorFeedbackOffloadAndActivations) {
  MemoryInputs in = equal_units(8, 4096, 2, 3);
  in.unit_numel[0] = 1024;
  const int64_t psi = 8 * 4096 + 1024;
  const MemoryPrediction base = predict_memory(in);
  EXPECT_EQ(base.low_precision + base.compression + base.offloaded, 0);

  in.precision = Precision::kBf16;
  EXPECT_EQ(predict_memory(in).low_precision, 2 * psi);
  in.activation_checkpointing = true;
  EXPECT_EQ(predict_memory(in).low_precision, 2 * (1024 + 4096));
  EXPECT_EQ(predict_memory(in).model_state(), base.model_state()) << "masters stay fp32";

  in.error_feedback = true;
  EXPECT_EQ(predict_memory(in).compression, 4 * psi + 4 * psi / 2);
  in.activation_bytes = 12345;
  EXPECT_EQ(predict_memory(in).activations, 12345);

  // Disk offload at stage 3: master shards and Adam state go to disk, a two-unit window stays.
  in.offload = Offload::kDisk;
  const MemoryPrediction off = predict_memory(in);
  EXPECT_EQ(off.offloaded, base.optimizer + base.params);
  EXPECT_EQ(off.optimizer, 4 * 2 * (2 * 4096 / 2));
  EXPECT_EQ(off.params, 4 * (2 * 4096 / 2));
  EXPECT_EQ(off.grads, base.grads);
  in.stage = 0;
  EXPECT_THROW(predict_memory(in), InvalidArgument);
}

// The terms beyond the issue's model state are lines of their own, computed by hand here from
// what the collectives allocate (memory_model.h): the model state stays the closed form.
TEST(ZeroMemoryModel, CommBuffersAndEvaluationAreLinesOfTheirOwn) {
  MemoryInputs in = equal_units(2, 4096, 2, 0);  // root empty, two units of 4096 (no padding)
  in.bucket_bytes = 1024;                        // under one unit: a bucket is one unit
  const int64_t psi = 2 * 4096, unit = 4 * 4096;
  const int64_t expected[4] = {
      unit,                               // stage 0: ring scratch, under one bucket
      3 * unit,                           // stages 1-2: 3 buckets > shard copies + a unit
      3 * unit,                           //
      2 * (unit + unit / 2) + 3 * unit};  // stage 3: 2 buckets in and out, 2 staging, 1 gather
  const double n = 2;
  for (int stage = 0; stage <= 3; ++stage) {
    in.stage = stage;
    const MemoryPrediction m = predict_memory(in);
    EXPECT_EQ(m.comm_buffers, expected[stage]) << "stage " << stage;
    EXPECT_EQ(static_cast<double>(m.model_state()), issue_bytes(stage, psi, n, 2))
        << "stage " << stage;
    EXPECT_EQ(m.evaluation, 0) << "no evaluation asked for";
    const int64_t rest = m.model_state() + m.working_set + m.comm_buffers;
    EXPECT_EQ(m.heap, rest / 20) << "stage " << stage;  // 5% slack over the other terms
    EXPECT_EQ(m.resident(), rest + m.heap);
  }
  // Every stage keeps freed blocks in the heap (stage 3's flats are pooled apart): evaluation's
  // activations add whole.
  in.evaluation_activation_bytes = 5000;
  in.activation_bytes = 1000;
  for (int stage : {0, 3}) {
    in.stage = stage;
    const MemoryPrediction m = predict_memory(in);
    EXPECT_EQ(m.evaluation, 5000) << "stage " << stage;
    const int64_t rest = m.model_state() + m.working_set + m.comm_buffers + 1000 + 5000;
    EXPECT_EQ(m.resident(), rest + rest / 20);
  }
  in.evaluation_activation_bytes = -1;
  EXPECT_THROW(predict_memory(in), InvalidArgument);
}

// What a worker's peak adds to the prediction: the LibTorch process and two copies of its data.
TEST(ZeroMemoryModel, WorkerPeakAddsProcessAndData) {
  const MemoryPrediction m = predict_memory(equal_units(3, 1000, 2, 2));
  EXPECT_EQ(worker_peak_bytes(m, 0), m.resident() + (int64_t{192} << 20));
  EXPECT_EQ(worker_peak_bytes(m, 7) - worker_peak_bytes(m, 0), 14);
}

TEST(ZeroMemoryModel, RefusesBadInputs) {
  MemoryInputs ok = equal_units(2, 64, 2, 1);
  EXPECT_NO_THROW(predict_memory(ok));
  auto refused = [&](auto edit) {
    MemoryInputs in = ok;
    edit(in);
    EXPECT_THROW(predict_memory(in), InvalidArgument);
    EXPECT_THROW(zero_traffic(in), InvalidArgument);
  };
  refused([](MemoryInputs& in) { in.unit_numel.clear(); });
  refused([](MemoryInputs& in) { in.unit_numel[1] = -1; });
  refused([](MemoryInputs& in) { in.world_size = 0; });
  refused([](MemoryInputs& in) { in.stage = 4; });
  refused([](MemoryInputs& in) { in.alignment = 0; });
  refused([](MemoryInputs& in) { in.bucket_bytes = 0; });
  refused([](MemoryInputs& in) { in.micro_batches = 0; });
  refused([](MemoryInputs& in) { in.prefetch = -1; });
}

int64_t sent(const comm::TrafficStats& t, OpKind op) {
  return static_cast<int64_t>(t.bytes_sent[static_cast<int>(op)]);
}
int64_t ops(const comm::TrafficStats& t, OpKind op) {
  return static_cast<int64_t>(t.ops[static_cast<int>(op)]);
}

TEST(ZeroTraffic, HandComputedSmallCase) {
  // N = 3, A = 1, units {root 5, 7, 4} -> padded {6, 9, 6} elements = {24, 36, 24} bytes,
  // shards {8, 12, 8} bytes. AG of a shard: 2 · shard; RS of a flat: 2/3 · flat.
  MemoryInputs in;
  in.unit_numel = {5, 7, 4};
  in.world_size = 3;
  in.alignment = 1;
  in.stage = 0;  // AR of 16 floats = 64 bytes: 2·2·64/3 = 85.33 -> 85
  EXPECT_EQ(zero_traffic(in).total_bytes_sent(), 85u);
  in.stage = 1;  // RS 16 + 24 + 16, AG 16 + 24 + 16 = 112 = AR of 84 bytes: 2·2·84/3
  comm::TrafficStats t = zero_traffic(in);
  EXPECT_EQ(sent(t, OpKind::kReduceScatter), 56);
  EXPECT_EQ(sent(t, OpKind::kAllgather), 56);
  EXPECT_EQ(ops(t, OpKind::kReduceScatter), 3);
  in.stage = 3;  // root RS 16 + AG 16; unit 1 AG 24 + AG 24 + RS 24; unit 2 (last) AG 16 + RS 16
  t = zero_traffic(in);
  EXPECT_EQ(t.total_bytes_sent(), 136u);
  EXPECT_EQ(ops(t, OpKind::kAllgather), 4);
  EXPECT_EQ(ops(t, OpKind::kReduceScatter), 3);
  EXPECT_EQ(sent(t, OpKind::kAllreduce), 0);
  in.micro_batches = 2;  // everything per micro-batch but the root's gather (once per step)
  EXPECT_EQ(zero_traffic(in).total_bytes_sent(), 272u - 16u);
  in.stage = 2;  // RS every micro-batch, AG once
  EXPECT_EQ(zero_traffic(in).total_bytes_sent(), 56u * 2 + 56u);
  in.stage = 1;  // reduces once whatever the accumulation
  EXPECT_EQ(zero_traffic(in).total_bytes_sent(), 112u);
}

TEST(ZeroTraffic, StagesOneAndTwoEqualAllReduceOfThePaddedSizes) {
  for (int n : {1, 2, 3, 4, 7, 8}) {
    MemoryInputs in;
    in.unit_numel = {100, 4096, 333, 0, 70001};
    in.world_size = n;
    int64_t padded = 0;
    for (int64_t x : in.unit_numel) padded += padded_numel(x, n, in.alignment);
    const uint64_t ar = comm::wire_bytes(OpKind::kAllreduce, 4 * padded, n);
    for (int stage : {1, 2}) {
      in.stage = stage;
      EXPECT_EQ(zero_traffic(in).total_bytes_sent(), ar) << "stage " << stage << " N " << n;
    }
    in.stage = 0;
    EXPECT_EQ(zero_traffic(in).total_bytes_sent(),
              comm::wire_bytes(OpKind::kAllreduce, 4 * (100 + 4096 + 333 + 70001), n));
  }
}

TEST(ZeroTraffic, StageThreeTendsToOneAndAHalfAllReduces) {
  // L equal units, an empty root: (3L - 1) / 2L of all-reduce's bytes, rising to 1.5.
  double prev = 0;
  for (int64_t units : {1, 2, 10, 100, 1000}) {
    MemoryInputs in = equal_units(units, 16 * 4 * 3, 4, 1);
    const double ar = static_cast<double>(zero_traffic(in).total_bytes_sent());
    in.stage = 3;
    const double ratio = static_cast<double>(zero_traffic(in).total_bytes_sent()) / ar;
    EXPECT_DOUBLE_EQ(ratio, (3.0 * units - 1) / (2.0 * units)) << units << " units";
    EXPECT_GT(ratio, prev);
    EXPECT_LT(ratio, 1.5);
    prev = ratio;
  }
  EXPECT_GT(prev, 1.499);
  // A world of one sends nothing at any stage.
  MemoryInputs one = equal_units(5, 100, 1, 3);
  EXPECT_EQ(zero_traffic(one).total_bytes_sent(), 0u);
}

}  // namespace
}  // namespace krab::parallel::zero
