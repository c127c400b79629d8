// Gradient compression as DataParallel comm hooks.
//
// Every compressor has the same frame (CompressionHook):
//  * warm-up: the first `warmup_steps` optimizer steps are plain fp32 all-reduces;
//  * small tensors: parameters with fewer than `min_numel` elements (biases, norms) travel
//    uncompressed, in one fp32 all-reduce per bucket; the rest of the bucket is compressed;
//  * error feedback: what a step did not send (true value minus what the others will decode)
//    is kept per bucket and added to the next step's gradient, so nothing is lost, only late.
//    For every worker: sum over steps of sent + current residual = sum of its gradients.
// Every rank ends a step with bit-identical averaged gradients: each decodes the same bytes.
//
// The compressors (see docs/config.md, comm.compression):
//  * fp16, bf16, int8, onebit (CodecHook): the compressed part is cut into W equal pieces;
//    piece j of every rank goes to rank j (all-to-all of the encoded bytes); rank j decodes,
//    averages in fp32, adds its own second-level residual, encodes its averaged piece again,
//    and an all-gather of the encoded pieces gives every rank the average (two-level error
//    feedback as in DeepSpeed's 1-bit Adam). Bytes sent per rank: 2 (W-1)/W · encoded bytes,
//    the ring all-reduce's share, so traffic / fp32 = encoded size / 4 bytes per value.
//    onebit takes its signs after a randomized Hadamard rotation of each chunk by default
//    (rotation = hadamard; see codecs.cpp): on the 2-epoch CNN that is the difference between
//    ending 3 points below plain sync and ending level with it.
//  * topk (SparseHook): per block of 65,536 values, the ceil(ratio · block) largest |values|
//    of gradient + residual are sent as (uint16 index, fp16 value / block scale) pairs, all
//    payloads all-gathered (sparse payloads cannot be summed on the way) and averaged.
//    With momentum correction (below) the velocity is cleared where values were sent
//    (DGC's momentum factor masking).
//  * randomk (SparseHook): ceil(ratio · n) positions drawn from a generator seeded with
//    (seed, step, bucket) — the same positions on every rank, so the values are all-reduced
//    and no indices travel. Same error feedback and factor masking as topk.
//  * powersgd (PowerSgdHook): each matrix M (a parameter viewed as shape[0] x rest) with
//    (rows + cols) · rank < rows · cols is approximated as P Qᵀ: P = M Q, all-reduce P,
//    orthonormalise it, Q = Mᵀ P, all-reduce Q; Q is kept for the next step (warm start).
//    Two small all-reduces per bucket; other tensors go uncompressed.
//
// Two corrections before any of this, on every step (warm-up included), for every compressor:
//  * local gradient clipping (clip_norm > 0): the bucket's compressed part is scaled down to
//    that L2 norm when it is longer (DGC);
//  * momentum correction (momentum > 0): each worker keeps its own velocity u = m u + g over
//    the whole bucket and hands u, not g, to the reduction (DGC; 1-bit Adam compresses the
//    momentum for the same reason). The average of the workers' velocities is the velocity of
//    the averaged gradient, so with the optimizer's own momentum at 0 an uncompressed run is
//    heavy-ball SGD exactly; compressed, what error feedback delays is a smooth velocity, not
//    a noisy gradient. The sparse hooks clear the velocity where values were sent.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compress/codecs.h"
#include "parallel/comm_hook.h"

namespace krab::compress {

struct CompressionOptions {
  std::string name = "none";  // none | fp16 | bf16 | int8 | onebit | topk | randomk | powersgd
  double ratio = 0.01;        // topk, randomk: fraction of values sent, in (0, 1]
  int64_t rank = 4;           // powersgd
  int64_t chunk = 0;          // int8, onebit: values per scale (0: 256 for both)
  std::string rotation = "none";  // onebit: none | hadamard (rotate each chunk before the sign)
  int64_t warmup_steps = 0;   // plain fp32 steps first
  int64_t min_numel = 1024;   // smaller parameters go uncompressed
  bool error_feedback = true;
  double momentum = 0;        // momentum correction factor, in [0, 1) (0 = off)
  double clip_norm = 0;       // local gradient clipping of the compressed part (0 = off)
  uint64_t seed = 0;          // random-k positions, stochastic rounding, PowerSGD's first Q
};

// The names comm.compression accepts (without "none").
const std::vector<std::string>& compressor_names();

// Throws krab::InvalidArgument naming the comm.* key at fault.
void validate(const CompressionOptions& options);

// nullptr for "none" (DataParallel's plain all-reduce).
std::unique_ptr<parallel::CommHook> make_compression_hook(const CompressionOptions& options);

class CompressionHook : public parallel::CommHook {
 public:
  explicit CompressionHook(CompressionOptions options) : options_(std::move(options)) {}
  std::string name() const override { return options_.name; }
  void setup(const std::vector<parallel::BucketLayout>& buckets) override;
  comm::WorkPtr reduce(comm::Communicator& comm, at::Tensor& bucket, int64_t bucket_index,
                       int64_t step) override;

  // For tests: the compressed part of a bucket (its large parameters, in bucket order) as this
  // rank last sent it (decoded), and the error-feedback residual left after that step.
  const at::Tensor& last_sent(int64_t bucket) const { return state_[bucket].sent; }
  const at::Tensor& residual(int64_t bucket) const { return state_[bucket].residual; }
  // Number of values of a bucket that are compressed.
  int64_t compressed_numel(int64_t bucket) const { return state_[bucket].large_numel; }

 protected:
  struct Slot {
    int64_t offset;  // in the bucket
    int64_t numel;
    int64_t rows, cols;  // matrix view (rows = shape[0]), for PowerSGD
    int64_t packed;      // offset in the packed small or large buffer
  };
  struct BucketState {
    std::vector<Slot> small, large;
    int64_t small_numel = 0, large_numel = 0;
    at::Tensor small_buf, large_buf;  // packed gradients
    at::Tensor residual;              // error feedback (large part)
    at::Tensor sent;                  // last decoded own contribution (large part)
    at::Tensor velocity_small, velocity_large;  // momentum correction (packed), if on
  };
  // Clipping and momentum correction of the bucket, in place (see the header comment).
  void correct(BucketState& st, at::Tensor& bucket) const;
  // Which parameters are compressed; default: numel >= min_numel.
  virtual bool compressible(const parallel::ParamSlot& slot) const;
  // Starts compressing `x` (the bucket's large part, gradient + residual already added) and
  // returns a Work whose wait() leaves the average over ranks in `x`. Must set st.sent to the
  // decoded own contribution before the Work completes; the frame computes the residual.
  virtual comm::WorkPtr start(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                              int64_t bucket, int64_t step) = 0;
  // Hook-specific state per bucket, created in setup().
  virtual void setup_bucket(BucketState& st, int64_t bucket) {}
  // Turns the packed gradient `x` into what is to be compressed: by default adds the
  // error-feedback residual.
  virtual void accumulate(BucketState& st, at::Tensor& x, int64_t bucket);

  CompressionOptions options_;
  std::vector<BucketState> state_;
};

class CodecHook : public CompressionHook {
 public:
  explicit CodecHook(CompressionOptions options);

 protected:
  comm::WorkPtr start(comm::Communicator& comm, BucketState& st, at::Tensor& x, int64_t bucket,
                      int64_t step) override;
  void setup_bucket(BucketState& st, int64_t bucket) override;

 private:
  std::unique_ptr<Codec> codec_;
  std::vector<at::Tensor> server_residual_;  // second-level error feedback, per bucket
};

class SparseHook : public CompressionHook {
 public:
  explicit SparseHook(CompressionOptions options);

 protected:
  comm::WorkPtr start(comm::Communicator& comm, BucketState& st, at::Tensor& x, int64_t bucket,
                      int64_t step) override;

 private:
  comm::WorkPtr start_topk(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                           int64_t bucket);
  comm::WorkPtr start_randomk(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                              int64_t bucket, int64_t step);
};

class PowerSgdHook : public CompressionHook {
 public:
  explicit PowerSgdHook(CompressionOptions options) : CompressionHook(std::move(options)) {}

 protected:
  bool compressible(const parallel::ParamSlot& slot) const override;
  comm::WorkPtr start(comm::Communicator& comm, BucketState& st, at::Tensor& x, int64_t bucket,
                      int64_t step) override;
  void setup_bucket(BucketState& st, int64_t bucket) override;

 private:
  std::vector<std::vector<at::Tensor>> q_;  // per bucket, per large slot: cols x rank
};

}  // namespace krab::compress
