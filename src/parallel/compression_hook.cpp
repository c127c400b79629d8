#include "parallel/compression_hook.h"

#include <torch/torch.h>

#include <cmath>

#include "core/errors.h"
#include "parallel/auto_compression.h"
#include "parallel/then_work.h"

namespace krab::parallel {

using compress::Aggregation;

CompressionHook::CompressionHook(std::unique_ptr<compress::Compressor> compressor)
    : compressor_(std::move(compressor)), options_(compressor_->options()) {}

std::string CompressionHook::name() const { return compress::kind_name(options_.kind); }

std::vector<compress::Segment> CompressionHook::plan(const BucketLayout& layout,
                                                     BucketState& st) const {
  std::vector<compress::Segment> segments;
  for (const ParamSlot& p : layout) {
    const int64_t n = p.numel();
    if (compressor_->compressible(p.shape)) {
      const int64_t rows = p.shape.empty() ? 1 : p.shape[0];
      segments.push_back({st.large_numel, n, rows, rows > 0 ? n / rows : 0});
      st.large.push_back({p.offset, n, st.large_numel});
      st.large_numel += n;
    } else {
      st.small.push_back({p.offset, n, st.small_numel});
      st.small_numel += n;
    }
  }
  return segments;
}

void CompressionHook::setup(const std::vector<BucketLayout>& buckets) {
  state_.clear();
  state_.resize(buckets.size());
  std::vector<std::vector<compress::Segment>> streams;
  for (size_t b = 0; b < buckets.size(); ++b) {
    BucketState& st = state_[b];
    streams.push_back(plan(buckets[b], st));
    st.small_buf = torch::zeros({st.small_numel});
    st.large_buf = torch::zeros({st.large_numel});
    if (options_.momentum > 0) {
      st.velocity_small = torch::zeros({st.small_numel});
      st.velocity_large = torch::zeros({st.large_numel});
    }
  }
  compressor_->setup(streams);
}

comm::WorkPtr CompressionHook::reduce(comm::Communicator& comm, at::Tensor& bucket,
                                      int64_t bucket_index, int64_t step) {
  KRAB_CHECK(bucket_index >= 0 && bucket_index < static_cast<int64_t>(state_.size()),
             "compression hook: bucket ", bucket_index, " was not set up");
  BucketState& st = state_[bucket_index];
  torch::NoGradGuard no_grad;
  correct(st, bucket);
  if (step < options_.warmup_steps || st.large.empty())
    return comm.allreduce(bucket, comm::ReduceOp::kAvg);

  auto pack = [&](const std::vector<Slot>& slots, const at::Tensor& buf) {
    for (const Slot& s : slots)
      buf.narrow(0, s.packed, s.numel).copy_(bucket.narrow(0, s.offset, s.numel));
  };
  comm::WorkPtr small_work;
  if (!st.small.empty()) {
    pack(st.small, st.small_buf);
    small_work = comm.allreduce(st.small_buf, comm::ReduceOp::kAvg);
  }
  pack(st.large, st.large_buf);
  const compress::Context ctx{bucket_index, step, comm.rank(), comm.size()};
  compressor_->begin(ctx, st.large_buf);
  comm::WorkPtr work = start_round(comm, ctx, 0, st.large_buf);

  at::Tensor out = bucket;
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{small_work, work}, [this, ctx, out]() mutable {
        torch::NoGradGuard guard;
        compressor_->end(ctx);
        const BucketState& s = state_[ctx.stream];
        auto unpack = [&](const std::vector<Slot>& slots, const at::Tensor& buf) {
          for (const Slot& sl : slots)
            out.narrow(0, sl.offset, sl.numel).copy_(buf.narrow(0, sl.packed, sl.numel));
        };
        unpack(s.small, s.small_buf);
        unpack(s.large, s.large_buf);
      });
}

comm::WorkPtr CompressionHook::start_round(comm::Communicator& comm, const compress::Context& ctx,
                                           int64_t round, at::Tensor x) {
  compress::Encoded e = compressor_->encode(ctx, round, x);
  const at::Tensor& velocity = state_[ctx.stream].velocity_large;
  if (e.positions.defined() && velocity.defined()) velocity.index_fill_(0, e.positions, 0.0f);

  at::Tensor combined;  // what decode() (kReencode: reencode()) will read
  comm::WorkPtr first;
  switch (compressor_->aggregation()) {
    case Aggregation::kSum:
      combined = e.payload;  // averaged in place
      first = comm.allreduce(combined, comm::ReduceOp::kAvg);
      break;
    case Aggregation::kGather:
      combined = torch::empty({ctx.world * e.payload.numel()}, e.payload.options());
      first = comm.allgather(e.payload, combined);
      break;
    case Aggregation::kReencode:  // piece j of the payload to rank j
      combined = torch::empty_like(e.payload);
      first = comm.alltoall(e.payload, combined);
      break;
  }
  // The payload is held until the collective is done, whatever the backend keeps of it.
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{first},
      [this, &comm, ctx, round, x, combined, payload = e.payload]() mutable {
        torch::NoGradGuard guard;
        if (compressor_->aggregation() == Aggregation::kReencode) {
          // `combined` holds every rank's piece for this rank: re-encode, then gather the
          // pieces into a payload-sized tensor (the same size as what was sent).
          at::Tensor piece = compressor_->reencode(ctx, combined);
          at::Tensor gathered = torch::empty_like(combined);
          comm.allgather(piece, gathered)->wait();
          combined = gathered;
        }
        compressor_->decode(ctx, round, combined, x);
        if (round + 1 < compressor_->rounds()) start_round(comm, ctx, round + 1, x)->wait();
      });
}

void CompressionHook::correct(BucketState& st, at::Tensor& bucket) const {
  if (options_.clip_norm > 0 && !st.large.empty()) {
    double sq = 0;
    for (const Slot& s : st.large)
      sq += bucket.narrow(0, s.offset, s.numel).square().sum().item<double>();
    const double norm = std::sqrt(sq);
    if (norm > options_.clip_norm)
      for (const Slot& s : st.large)
        bucket.narrow(0, s.offset, s.numel).mul_(options_.clip_norm / norm);
  }
  if (options_.momentum > 0) {
    auto update = [&](const std::vector<Slot>& slots, const at::Tensor& velocity) {
      for (const Slot& s : slots) {
        at::Tensor u = velocity.narrow(0, s.packed, s.numel);
        at::Tensor g = bucket.narrow(0, s.offset, s.numel);
        u.mul_(options_.momentum).add_(g);
        g.copy_(u);
      }
    };
    update(st.small, st.velocity_small);
    update(st.large, st.velocity_large);
  }
}

std::unique_ptr<CommHook> make_compression_hook(const compress::CompressionOptions& options) {
  if (options.automatic) return std::make_unique<AutoCompressionHook>(options);
  std::unique_ptr<compress::Compressor> compressor = compress::make_compressor(options);
  if (!compressor) return nullptr;
  return std::make_unique<CompressionHook>(std::move(compressor));
}

}  // namespace krab::parallel
