// CompressionHook: DataParallel's comm hook that runs a compress::Compressor over its buckets.
//
// The compressor (compress/compressor.h) knows payloads, not networks; this hook is the
// executor that moves them with the bucket's Communicator, as the compressor's aggregation()
// says: kSum by all-reduce (average), kGather by all-gather, kReencode by all-to-all of the
// pieces, re-encoding, and all-gather of the re-encoded pieces. It lives in parallel/ because it
// is where buckets and collectives meet; compress/ stays below parallel/ so that other layers
// (the parameter server's pushes) can use the same compressors.
//
// Each bucket is one stream of the compressor: its compressed part (the parameters the
// compressor finds compressible(), packed in bucket order). Around the compressor, per bucket:
//  * warm-up: the first `warmup_steps` optimizer steps are plain fp32 all-reduces;
//  * small tensors: parameters the compressor does not compress (by default those with fewer
//    than `min_numel` elements: biases, norms) travel uncompressed, in one fp32 all-reduce per
//    bucket, issued before the compressed part's collectives;
//  * local gradient clipping (clip_norm > 0): the bucket's compressed part is scaled down to
//    that L2 norm when it is longer (DGC);
//  * momentum correction (momentum > 0): each worker keeps its own velocity u = m u + g over
//    the whole bucket and hands u, not g, to the reduction (DGC; 1-bit Adam compresses the
//    momentum for the same reason). The average of the workers' velocities is the velocity of
//    the averaged gradient, so with the optimizer's own momentum at 0 an uncompressed run is
//    heavy-ball SGD exactly; compressed, what error feedback delays is a smooth velocity, not
//    a noisy gradient. Where a sparse compressor sent values (Encoded::positions) the velocity
//    is cleared (DGC's momentum factor masking).
// Clipping and momentum correction run on every step, warm-up included.
// Every rank ends a step with bit-identical averaged gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compress/compressor.h"
#include "parallel/comm_hook.h"

namespace krab::parallel {

class CompressionHook : public CommHook {
 public:
  explicit CompressionHook(std::unique_ptr<compress::Compressor> compressor);
  std::string name() const override;
  void setup(const std::vector<BucketLayout>& buckets) override;
  comm::WorkPtr reduce(comm::Communicator& comm, at::Tensor& bucket, int64_t bucket_index,
                       int64_t step) override;

  // For tests: the compressed part of a bucket (its large parameters, in bucket order) as this
  // rank last sent it (decoded), and the error-feedback residual left after that step.
  const at::Tensor& last_sent(int64_t bucket) const { return compressor_->last_sent(bucket); }
  const at::Tensor& residual(int64_t bucket) const { return compressor_->residual(bucket); }
  // Number of values of a bucket that are compressed.
  int64_t compressed_numel(int64_t bucket) const { return state_[bucket].large_numel; }

 private:
  struct Slot {
    int64_t offset;  // in the bucket
    int64_t numel;
    int64_t packed;  // offset in the packed small or large buffer
  };
  struct BucketState {
    std::vector<Slot> small, large;
    int64_t small_numel = 0, large_numel = 0;
    at::Tensor small_buf, large_buf;            // packed gradients
    at::Tensor velocity_small, velocity_large;  // momentum correction (packed), if on
  };
  // Splits a bucket into its small and large slots; returns the large ones as segments.
  std::vector<compress::Segment> plan(const BucketLayout& layout, BucketState& st) const;
  // Clipping and momentum correction of the bucket, in place (see the header comment).
  void correct(BucketState& st, at::Tensor& bucket) const;
  // Encodes round `round` of x (the bucket's packed large part) and starts combining it; the
  // returned Work's wait() runs the remaining rounds, leaving the average in x.
  comm::WorkPtr start_round(comm::Communicator& comm, const compress::Context& ctx, int64_t round,
                            at::Tensor x);

  std::unique_ptr<compress::Compressor> compressor_;
  const compress::CompressionOptions& options_;  // the compressor's
  std::vector<BucketState> state_;
};

// nullptr for CompressorKind::kNone (DataParallel's plain all-reduce). Validates the options.
std::unique_ptr<CommHook> make_compression_hook(const compress::CompressionOptions& options);

}  // namespace krab::parallel
