// GradReducer: the gradients of ZeRO stages 1-2, reduce-scattered from backward into one fp32
// gradient shard per unit (docs/design/zero-sharding.md §2.1, §2.3, §2.4).
//
// Planning (pure, plan_zero_buckets): the non-empty units, in backward order (the reverse of
// the layout's order: the last unit of the forward first, the root unit last), are packed
// into buckets of at most `bucket_bytes` (a unit larger than that is a bucket of its own). A
// bucket's buffer is laid out **rank-major**: with S_u the shard size of unit u and
// L = Σ S_u over the bucket's units,
//
//   buffer = [ u1 chunk 0 | u2 chunk 0 | u1 chunk 1 | u2 chunk 1 | ... ]     W · L elements
//
// where chunk j of u is flat_u[j · S_u, (j + 1) · S_u). A reduce-scatter of the buffer into L
// elements then leaves exactly [u1 shard r | u2 shard r] on rank r: one collective per bucket,
// and every rank receives only what it owns.
//
// Executing (GradReducer): a gradient-ready hook on every parameter (parallel/grad_hooks.h)
// copies the parameter's gradient into its bucket's buffer (a parameter may straddle chunk
// boundaries: ShardLayout::pieces gives the runs); at stage 2 it then releases the
// parameter's .grad. When a bucket has all its gradients it is launched — strictly in bucket
// order, so that every rank issues the same reduce-scatters in the same order — as an
// averaging reduce-scatter. At most two buckets are in flight, and a bucket's buffer is only
// allocated (at its first gradient) after the oldest of two in flight has been waited for and
// folded into the shards: where buckets fill one after another (each unit's gradients arrive
// together), at most two buffers are alive. A unit whose gradients arrive spread over the
// backward (GPT's root: the head's first, the embeddings' last) keeps its buffer meanwhile.
// finish() (after the backward) treats every parameter that got no gradient as a zero gradient,
// launches the rest, waits for all and folds: the first fold of a step copies into the grad shard,
// later ones (stage 2, gradient accumulation: one reduce per micro-batch) add to it. Buffers are
// allocated per launch and dropped after their fold, so buckets cost at most two buffers at once.
//
// With a compressor (fp16, bf16) a bucket goes through ShardedCompression instead of a plain
// reduce-scatter; everything else here is the same.
//
// Reduction order: Gloo's reduce-scatter sums ranks 0..W-1 in order then divides by W; for
// W = 2 that equals the ring all-reduce of stage 0 bit for bit (§1.5).
//
// Thread safety: the training thread drives it; the hooks run on the backward thread, which
// for LibTorch's CPU engine is the thread that called backward() (the training thread).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "compress/compressor.h"
#include "engine/shard_layout.h"
#include "parallel/grad_hooks.h"

namespace krab::parallel::zero {

class ShardedCompression;  // sharded_compression.h

// One bucket: its units (in backward order) and where each unit's shard sits in a rank's
// segment of the buffer.
struct ZeroBucket {
  std::vector<int> units;
  std::vector<int64_t> unit_offset;  // unit_offset[k]: start of units[k]'s chunk in a segment
  int64_t segment = 0;               // L = Σ S_u: one rank's segment, the reduce-scatter output
  int64_t numel(int world) const { return segment * world; }  // W · L: the buffer
};

struct ZeroBucketPlan {
  int world = 0;
  std::vector<ZeroBucket> buckets;  // in launch order
};

// The buckets of `layout` under a cap of `bucket_bytes` (fp32; 0 = one unit per bucket).
// Pure. Units of 0 elements are in no bucket. Throws InvalidArgument for bucket_bytes < 0.
ZeroBucketPlan plan_zero_buckets(const engine::ShardLayout& layout, int64_t bucket_bytes);

// Where element e of unit u's flat goes in its bucket's buffer (the rank-major map above).
int64_t bucket_position(const engine::ShardLayout& layout, const ZeroBucket& bucket, int k,
                        int64_t element);

class GradReducer {
 public:
  // `params[u][i]` is layout.unit(u).params[i] (the parameters, as UnitStorage made them).
  // `release_grads`: stage 2, drop each parameter's .grad once it is in its bucket.
  // `compressor`: null for fp32 reduce-scatters, else the buckets go through it
  // (sharded_compression.h; InvalidArgument for a compressor it cannot drive).
  GradReducer(const engine::ShardLayout& layout, std::vector<std::vector<at::Tensor>> params,
              comm::Communicator& comm, int64_t bucket_bytes, bool release_grads,
              std::unique_ptr<compress::Compressor> compressor = nullptr);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Whether the next backward reduces (stage 1: only the step's last micro-batch).
  void set_sync(bool sync) { sync_ = sync; }
  // After a backward that synced: see the class comment. Rethrows the first communication
  // error. No-op when the backward did not sync.
  void finish();

  // fp32 [S_u], this rank's average gradient of unit u since the last release_shards();
  // undefined before the first fold (and for units of 0 elements).
  const at::Tensor& grad_shard(int unit) const { return shards_.at(unit); }
  // Drops the grad shards, after the optimizer step (which it counts: compression's warm-up).
  void release_shards();
  // "none", or the compressor's name.
  std::string compression() const;

  const ZeroBucketPlan& plan() const { return plan_; }
  // The most bytes of bucket buffers alive at once so far.
  int64_t peak_bucket_bytes() const { return peak_bytes_; }

 private:
  // One run of a parameter's elements in its bucket's buffer.
  struct Run {
    int64_t param_offset, length, buffer_offset;
  };
  struct Param {
    at::Tensor tensor;
    int bucket = 0;
    std::vector<Run> runs;
  };
  struct InFlight {
    int bucket;
    comm::WorkPtr work;
    at::Tensor input, output;
  };

  void plan_runs(const engine::ShardLayout& layout, std::vector<std::vector<at::Tensor>> params);
  void begin_step();
  void on_grad_ready(int64_t param);
  at::Tensor& buffer(int bucket);
  void launch_ready();
  void launch(int bucket);
  void fold_oldest();

  const engine::ShardLayout& layout_;
  comm::Communicator& comm_;
  const bool release_grads_;
  ZeroBucketPlan plan_;
  std::unique_ptr<ShardedCompression> compression_;
  std::vector<Param> params_;
  std::vector<int64_t> bucket_params_;  // parameters per bucket
  std::vector<at::Tensor> buffers_;     // allocated at a bucket's first gradient
  std::vector<int64_t> pending_;
  std::vector<char> filled_;
  std::vector<InFlight> in_flight_;  // oldest first
  std::vector<at::Tensor> shards_;
  int next_launch_ = 0;
  int64_t step_ = 0;  // optimizer steps so far
  bool sync_ = true;
  bool active_ = false;
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
  // Last: destroyed first, so no hook reaches a half-destroyed reducer.
  std::unique_ptr<GradReadyHooks> hooks_;
};

}  // namespace krab::parallel::zero
