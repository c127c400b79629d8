#include "parallel/zero/memory_model.h"

#include <algorithm>

#include "core/errors.h"
#include "engine/shard_layout.h"

namespace krab::parallel::zero {
namespace {

constexpr int64_t kFloat = 4;  // fp32 bytes: every state tensor and every gather is fp32
constexpr int64_t kBf16 = 2;

void validate(const MemoryInputs& in) {
  KRAB_CHECK_ARG(!in.unit_numel.empty(),
                 "memory model: unit_numel is empty (the root unit, [0], "
                 "is always there, even with 0 parameters)");
  for (size_t u = 0; u < in.unit_numel.size(); ++u)
    KRAB_CHECK_ARG(in.unit_numel[u] >= 0, "memory model: unit_numel[", u, "] is negative (",
                   in.unit_numel[u], ")");
  KRAB_CHECK_ARG(in.world_size >= 1, "memory model: world_size must be >= 1, got ", in.world_size);
  KRAB_CHECK_ARG(in.stage >= 0 && in.stage <= 3, "memory model: stage must be 0..3, got ",
                 in.stage);
  KRAB_CHECK_ARG(in.alignment >= 1, "memory model: alignment must be >= 1, got ", in.alignment);
  KRAB_CHECK_ARG(in.prefetch >= 0, "memory model: prefetch must be >= 0, got ", in.prefetch);
  KRAB_CHECK_ARG(in.bucket_bytes > 0, "memory model: bucket_bytes must be > 0, got ",
                 in.bucket_bytes);
  KRAB_CHECK_ARG(in.activation_bytes >= 0, "memory model: activation_bytes must be >= 0, got ",
                 in.activation_bytes);
  KRAB_CHECK_ARG(in.evaluation_activation_bytes >= 0,
                 "memory model: evaluation_activation_bytes must be >= 0, got ",
                 in.evaluation_activation_bytes);
  KRAB_CHECK_ARG(in.micro_batches >= 1, "memory model: micro_batches must be >= 1, got ",
                 in.micro_batches);
  KRAB_CHECK_ARG(in.offload == Offload::kNone || in.stage >= 1,
                 "memory model: offload disk needs stage >= 1 (stage 0 has no shards)");
  KRAB_CHECK_ARG(!in.replicate_shards || in.stage >= 1,
                 "memory model: replicate_shards needs stage >= 1 (stage 0 has no shards)");
  KRAB_CHECK_ARG(!in.replicate_shards || in.offload == Offload::kNone,
                 "memory model: replicate_shards cannot be combined with offload disk");
}

// The sums the table is written in, in elements.
struct Sizes {
  int64_t psi = 0;        // Σ numel_u
  int64_t psi_p = 0;      // Σ padded_u
  int64_t root = 0;       // numel of the root unit
  int64_t root_p = 0;     // padded root
  int64_t max_p = 0;      // Ψmax: largest padded non-root unit
  int64_t max_any_p = 0;  // largest padded unit, root included
  int64_t max_any = 0;    // largest unit, root included, unpadded
  int64_t max_unit = 0;   // largest non-root unit, unpadded
};

Sizes sizes(const MemoryInputs& in) {
  Sizes s;
  for (size_t u = 0; u < in.unit_numel.size(); ++u) {
    const int64_t n = in.unit_numel[u];
    const int64_t p = padded_numel(n, in.world_size, in.alignment);
    s.psi += n;
    s.psi_p += p;
    s.max_any_p = std::max(s.max_any_p, p);
    s.max_any = std::max(s.max_any, n);
    if (u == 0) {
      s.root = n;
      s.root_p = p;
    } else {
      s.max_p = std::max(s.max_p, p);
      s.max_unit = std::max(s.max_unit, n);
    }
  }
  return s;
}

// Two buckets in flight, each at most the cap or one whole unit (a unit over the cap is a bucket
// of its own).
int64_t buckets_in_flight(const MemoryInputs& in, const Sizes& s) {
  return 2 * std::max(in.bucket_bytes, kFloat * s.max_any_p);
}

// Stage 3's peak working set. During backward: the root's flat (gathered for the whole step) and
// its full gradient (its parameters, e.g. a GPT's head, get gradients first and are reduced
// last), 1 + prefetch gathered units, and one unit's full gradient plus its bucket. At the end:
// every other unit freed, the root's flat, gradient and bucket. The design's §5.1 row is the
// first phase without the root's gradient.
int64_t stage3_working_set(const MemoryInputs& in, const Sizes& s) {
  const int64_t root_flat = kFloat * s.root_p;
  const int64_t root_grad = kFloat * s.root;
  const int64_t during_backward =
      root_flat + root_grad + kFloat * (1 + in.prefetch) * s.max_p + 2 * kFloat * s.max_p;
  const int64_t root_reduce = root_flat + root_grad + kFloat * s.root_p;
  return std::max(during_backward, root_reduce);
}

// Buffers that live inside a collective or between a bucket's fill and its fold, beyond the
// working set (memory_model.h, comm_buffers). `bucket` is one bucket's bytes, `unit` the
// largest padded unit's.
int64_t comm_buffer_bytes(const MemoryInputs& in, const Sizes& s) {
  const int64_t unit = kFloat * s.max_any_p;
  const int64_t bucket = std::max(in.bucket_bytes, unit);
  switch (in.stage) {
    case 0:
      // Gloo's ring all-reduce scratch: under one bucket (and under the model).
      return std::min(bucket, kFloat * s.psi);
    case 1:
    case 2:
      // Backward: a third bucket filling while two are in flight, and the staging buffer of
      // each reduce-scatter in flight. After the step: the shard copies every all-gather sends
      // from, and c10d's output temporary of the one gather running.
      return std::max(3 * bucket, kFloat * s.psi_p / in.world_size + unit);
    default:
      // Buckets are one unit each: two more in flight than the working set counts (input and
      // output), their staging buffers, and c10d's temporary of the running all-gather.
      return 2 * (unit + unit / in.world_size) + 2 * unit + unit;
  }
}

// Evaluation's bytes beyond the training step's (memory_model.h, evaluation). Every stage's
// workers keep freed blocks in the heap (mmap threshold 32 MiB, trim threshold 1 GiB; stage 3's
// flats are mapped apart by its FlatPool), where evaluation's larger tensors rarely fit the
// holes the step's left, so the phases add (measured, gpt 12.8 M on 2 workers: the larger of
// the two missed stages 0-2's VmHWM by 90-120 MiB, their sum held it within 1-7%).
int64_t evaluation_bytes(const MemoryInputs& in) { return in.evaluation_activation_bytes; }

// The four columns of the table.
void fill_stage(const MemoryInputs& in, const Sizes& s, MemoryPrediction& m) {
  const int64_t n = in.world_size;
  const int64_t k = optimizer_values_per_param(in.optimizer, in.amsgrad);
  const int64_t shard = s.psi_p / n;  // Σ S_u, exact: each padded_u is a multiple of N
  switch (in.stage) {
    case 0:
      m.params = kFloat * s.psi;
      m.grads = kFloat * s.psi;
      m.optimizer = kFloat * k * s.psi;
      m.working_set = kFloat * s.psi;
      return;
    case 1:
      m.params = kFloat * s.psi_p;
      m.grads = kFloat * s.psi;
      m.optimizer = kFloat * k * shard;
      m.working_set = kFloat * shard + buckets_in_flight(in, s);
      return;
    case 2:
      m.params = kFloat * s.psi_p;
      m.grads = kFloat * shard;
      m.optimizer = kFloat * k * shard;
      m.working_set = kFloat * s.max_any + buckets_in_flight(in, s);
      return;
    default:
      m.params = kFloat * shard;
      m.grads = kFloat * shard;
      m.optimizer = kFloat * k * shard;
      m.working_set = stage3_working_set(in, s);
      return;
  }
}

// Disk offload: the optimizer state, and stage 3's master shards, go to the file; RAM keeps the
// two-unit window the step walks through (§6.2).
void apply_offload(const MemoryInputs& in, const Sizes& s, MemoryPrediction& m) {
  if (in.offload != Offload::kDisk) return;
  const int64_t k = optimizer_values_per_param(in.optimizer, in.amsgrad);
  const int64_t window_shard = 2 * s.max_any_p / in.world_size;
  m.offloaded = m.optimizer;
  m.optimizer = std::min(m.optimizer, kFloat * k * window_shard);
  if (in.stage == 3) {
    m.offloaded += m.params;
    m.params = std::min(m.params, kFloat * window_shard);
  }
}

// The copy of the ward's shard (buddy.h): its gradient and optimizer state, and at stage 3 its
// master. A group of one has no buddy.
int64_t ward_bytes(const MemoryInputs& in, const Sizes& s) {
  if (!in.replicate_shards || in.world_size < 2) return 0;
  const int64_t k = optimizer_values_per_param(in.optimizer, in.amsgrad);
  const int64_t shard = s.psi_p / in.world_size;
  return kFloat * shard * (1 + k + (in.stage == 3 ? 1 : 0));
}

}  // namespace

int optimizer_values_per_param(OptimizerKind kind, bool amsgrad) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kSgdMomentum:
      return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return amsgrad ? 3 : 2;
  }
  throw InvalidArgument(str_cat("memory model: not an optimizer kind: ", static_cast<int>(kind)));
}

int64_t padded_numel(int64_t numel, int world_size, int64_t alignment) {
  KRAB_CHECK_ARG(numel >= 0 && world_size >= 1 && alignment >= 1,
                 "padded_numel: needs numel >= 0, world_size >= 1, alignment >= 1; got ", numel,
                 ", ", world_size, ", ", alignment);
  return engine::padded_numel(numel, world_size, alignment);  // the layout's own rule
}

MemoryPrediction predict_memory(const MemoryInputs& in) {
  validate(in);
  const Sizes s = sizes(in);
  MemoryPrediction m;
  fill_stage(in, s, m);
  m.comm_buffers = comm_buffer_bytes(in, s);
  if (in.precision == Precision::kBf16) {
    // Autocast's bf16 weight copies are saved by the ops that use them until their backward;
    // checkpointing under stage 3 re-creates them unit by unit (the root is not checkpointed).
    const bool one_unit = in.stage == 3 && in.activation_checkpointing;
    m.low_precision = kBf16 * (one_unit ? s.root + s.max_unit : s.psi);
  }
  if (in.error_feedback) m.compression = kFloat * s.psi + kFloat * s.psi_p / in.world_size;
  m.activations = in.activation_bytes;
  m.evaluation = evaluation_bytes(in);
  apply_offload(in, s, m);
  m.ward = ward_bytes(in, s);
  m.heap = m.resident() / kHeapSlackDivisor;  // resident() so far: heap is still 0
  return m;
}

comm::TrafficStats zero_traffic(const MemoryInputs& in) {
  validate(in);
  using comm::OpKind;
  const int n = in.world_size;
  const int64_t micro = in.micro_batches;
  comm::TrafficStats t;
  auto add = [&](OpKind op, int64_t payload_bytes, int64_t times) {
    for (int64_t i = 0; i < times; ++i)
      t.add(op, comm::wire_bytes(op, static_cast<uint64_t>(payload_bytes), n));
  };
  if (in.stage == 0) {
    const Sizes s = sizes(in);
    add(OpKind::kAllreduce, kFloat * s.psi, 1);
    return t;
  }
  const size_t units = in.unit_numel.size();
  size_t last = 0;  // the last non-empty unit in forward order (0: none but the root)
  for (size_t u = 1; u < units; ++u)
    if (in.unit_numel[u] > 0) last = u;
  for (size_t u = 0; u < units; ++u) {
    const int64_t bytes = kFloat * padded_numel(in.unit_numel[u], n, in.alignment);
    if (bytes == 0) continue;  // an empty unit has empty shards and no collectives
    const int64_t shard_bytes = bytes / n;
    if (in.stage < 3) {
      add(OpKind::kReduceScatter, bytes, in.stage == 1 ? 1 : micro);
      add(OpKind::kAllgather, shard_bytes, 1);
      continue;
    }
    // The root stays gathered (its values change only at the step): one gather per step.
    const bool root = u == 0;
    const bool last_in_forward = !root && u == last;
    const int64_t gathers = root ? 1 : (last_in_forward ? 1 : 2) * micro;
    add(OpKind::kAllgather, shard_bytes, gathers);
    add(OpKind::kReduceScatter, bytes, micro);
  }
  if (in.replicate_shards && n > 1)
    for (size_t u = 0; u < units; ++u) {
      const int64_t shard_bytes = kFloat * padded_numel(in.unit_numel[u], n, in.alignment) / n;
      if (shard_bytes == 0) continue;
      add(OpKind::kSend, shard_bytes, 1);
      add(OpKind::kRecv, shard_bytes, 1);
    }
  return t;
}

}  // namespace krab::parallel::zero
