#include "parallel/zero/grad_reducer.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "parallel/zero/sharded_compression.h"

namespace krab::parallel::zero {

ZeroBucketPlan plan_zero_buckets(const engine::ShardLayout& layout, int64_t bucket_bytes) {
  KRAB_CHECK_ARG(bucket_bytes >= 0, "parallel.bucket_mb must be >= 0, got ", bucket_bytes,
                 " bytes");
  ZeroBucketPlan plan;
  plan.world = layout.world();
  ZeroBucket open;
  int64_t open_bytes = 0;
  auto close = [&] {
    if (!open.units.empty()) plan.buckets.push_back(std::move(open));
    open = ZeroBucket();
    open_bytes = 0;
  };
  // Backward order: autograd reaches the last unit of the forward first, the root last.
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    const int64_t padded = layout.unit(u).padded;
    if (padded == 0) continue;
    const int64_t bytes = padded * static_cast<int64_t>(sizeof(float));
    if (!open.units.empty() && open_bytes + bytes > bucket_bytes) close();
    open.units.push_back(u);
    open.unit_offset.push_back(open.segment);
    open.segment += layout.shard_numel(u);
    open_bytes += bytes;
  }
  close();
  return plan;
}

int64_t bucket_position(const engine::ShardLayout& layout, const ZeroBucket& bucket, int k,
                        int64_t element) {
  const int64_t s = layout.shard_numel(bucket.units[k]);
  return (element / s) * bucket.segment + bucket.unit_offset[k] + element % s;
}

GradReducer::GradReducer(const engine::ShardLayout& layout,
                         std::vector<std::vector<at::Tensor>> params, comm::Communicator& comm,
                         int64_t bucket_bytes, bool release_grads,
                         std::unique_ptr<compress::Compressor> compressor)
    : layout_(layout),
      comm_(comm),
      release_grads_(release_grads),
      plan_(plan_zero_buckets(layout, bucket_bytes)) {
  KRAB_CHECK_ARG(layout.world() == comm.size(), "GradReducer: layout for ", layout.world(),
                 " ranks, group of ", comm.size());
  if (compressor)
    compression_ =
        std::make_unique<ShardedCompression>(layout, plan_, comm.rank(), std::move(compressor));
  plan_runs(layout, std::move(params));
  buffers_.resize(plan_.buckets.size());
  pending_.assign(plan_.buckets.size(), 0);
  filled_.assign(params_.size(), 0);
  shards_.resize(layout.num_units());
  std::vector<at::Tensor> tensors;
  for (const auto& p : params_) tensors.push_back(p.tensor);
  hooks_ =
      std::make_unique<GradReadyHooks>(tensors, [this](int64_t param) { on_grad_ready(param); });
}

GradReducer::~GradReducer() {
  hooks_.reset();
  for (auto& f : in_flight_) try {
      f.work->wait();  // never drop a buffer Gloo still reads or writes
    } catch (...) {
    }
}

// Precomputes, for every parameter, the runs of its elements in its bucket's buffer: the
// pieces of every rank's chunk of its unit, mapped through the rank-major layout.
void GradReducer::plan_runs(const engine::ShardLayout& layout,
                            std::vector<std::vector<at::Tensor>> params) {
  KRAB_CHECK_ARG(static_cast<int>(params.size()) == layout.num_units(),
                 "GradReducer: ", params.size(), " parameter lists for ", layout.num_units(),
                 " units");
  std::vector<int64_t> first(layout.num_units());
  for (int u = 0; u < layout.num_units(); ++u) {
    first[u] = static_cast<int64_t>(params_.size());
    for (auto& t : params[u]) params_.push_back({std::move(t), -1, {}});
  }
  bucket_params_.assign(plan_.buckets.size(), 0);
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const ZeroBucket& bucket = plan_.buckets[b];
    for (size_t k = 0; k < bucket.units.size(); ++k) {
      const int u = bucket.units[k];
      const int64_t n = static_cast<int64_t>(layout.unit(u).params.size());
      for (int64_t i = 0; i < n; ++i) params_[first[u] + i].bucket = static_cast<int>(b);
      bucket_params_[b] += n;
      for (int j = 0; j < layout.world(); ++j)
        for (const engine::Piece& piece : layout.pieces(u, layout.shard(u, j)))
          params_[first[u] + piece.param].runs.push_back(
              {piece.param_offset, piece.length,
               bucket_position(layout, bucket, static_cast<int>(k), piece.flat_offset)});
    }
  }
}

void GradReducer::begin_step() {
  active_ = true;
  next_launch_ = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) pending_[b] = bucket_params_[b];
  std::fill(filled_.begin(), filled_.end(), 0);
}

at::Tensor& GradReducer::buffer(int bucket) {
  at::Tensor& buf = buffers_[bucket];
  if (!buf.defined()) {
    // Two buckets in flight and a third about to fill: the oldest lands first, so buckets
    // in flight and filling stay two where buckets fill one after another.
    if (in_flight_.size() >= 2) fold_oldest();
    // Zeros: padding, and parameters that get no gradient, reduce as 0.
    buf = torch::zeros({plan_.buckets[bucket].numel(layout_.world())}, torch::kFloat);
    live_bytes_ += static_cast<int64_t>(buf.nbytes());
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  }
  return buf;
}

void GradReducer::on_grad_ready(int64_t index) {
  if (!sync_) return;
  if (!active_) begin_step();
  Param& p = params_[index];
  if (p.bucket < 0 || filled_[index]) return;  // a 0-element unit; a second use of a parameter
  filled_[index] = 1;
  torch::NoGradGuard no_grad;
  const at::Tensor& grad = p.tensor.grad();
  if (grad.defined()) {
    at::Tensor g = grad.reshape({-1});
    at::Tensor& buf = buffer(p.bucket);
    for (const Run& r : p.runs)
      buf.narrow(0, r.buffer_offset, r.length).copy_(g.narrow(0, r.param_offset, r.length));
    if (release_grads_) p.tensor.mutable_grad() = at::Tensor();
  }
  if (--pending_[p.bucket] == 0) launch_ready();
}

void GradReducer::launch_ready() {
  while (next_launch_ < static_cast<int>(plan_.buckets.size()) && pending_[next_launch_] == 0)
    launch(next_launch_++);
}

void GradReducer::launch(int bucket) {
  if (in_flight_.size() >= 2) fold_oldest();  // after finish() zero-filled several buckets
  InFlight f;
  f.bucket = bucket;
  f.input = buffer(bucket);
  buffers_[bucket] = at::Tensor();
  f.output = torch::empty({plan_.buckets[bucket].segment}, torch::kFloat);
  live_bytes_ += static_cast<int64_t>(f.output.nbytes());
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  f.work = compression_ ? compression_->reduce(comm_, bucket, f.input, f.output, step_)
                        : comm_.reduce_scatter(f.input, f.output, comm::ReduceOp::kAvg);
  in_flight_.push_back(std::move(f));
}

// Waits for the oldest bucket in flight and adds (or, first in a step, copies) its output into
// the grad shards of its units.
void GradReducer::fold_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  f.work->wait();
  torch::NoGradGuard no_grad;
  const ZeroBucket& bucket = plan_.buckets[f.bucket];
  for (size_t k = 0; k < bucket.units.size(); ++k) {
    const int u = bucket.units[k];
    at::Tensor part = f.output.narrow(0, bucket.unit_offset[k], layout_.shard_numel(u));
    if (shards_[u].defined())
      shards_[u].add_(part);
    else
      shards_[u] = part.clone();
  }
  live_bytes_ -= static_cast<int64_t>(f.input.nbytes() + f.output.nbytes());
}

void GradReducer::finish() {
  if (!sync_) return;
  // No gradient at all (an empty batch): still take part in every collective.
  if (!active_) begin_step();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (filled_[i] || params_[i].bucket < 0) continue;
    filled_[i] = 1;
    buffer(params_[i].bucket);  // zeros stand for the missing gradient
    --pending_[params_[i].bucket];
  }
  launch_ready();
  KRAB_CHECK(next_launch_ == static_cast<int>(plan_.buckets.size()), "GradReducer: bucket ",
             next_launch_, " of ", plan_.buckets.size(), " not launched");
  active_ = false;
  while (!in_flight_.empty()) fold_oldest();
}

void GradReducer::release_shards() {
  for (auto& s : shards_) s = at::Tensor();
  ++step_;
}

std::string GradReducer::compression() const {
  return compression_ ? compression_->name() : "none";
}

}  // namespace krab::parallel::zero
