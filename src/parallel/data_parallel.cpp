#include "parallel/data_parallel.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "core/flat.h"

namespace krab::parallel {

DataParallel::DataParallel(torch::nn::Module& module, comm::Communicator& comm,
                           DataParallelOptions options, std::unique_ptr<CommHook> hook)
    : module_(module), comm_(comm), options_(options), hook_(std::move(hook)) {
  if (!hook_) hook_ = std::make_unique<AllreduceHook>();
  for (auto& p : module_.parameters())
    if (p.requires_grad()) params_.push_back(p);
  KRAB_CHECK_ARG(!params_.empty(), "DataParallel: the module has no trainable parameters");
  std::vector<int64_t> numel;
  for (auto& p : params_) {
    KRAB_CHECK_ARG(p.scalar_type() == at::kFloat, "DataParallel: parameters must be float32, got ",
                   p.scalar_type());
    numel.push_back(p.numel());
  }
  const auto cap = static_cast<int64_t>(options_.bucket_mb * 1024 * 1024);
  plan_ = plan_buckets(numel, sizeof(float), cap);
  for (int64_t n : plan_.bucket_numel) buffers_.push_back(torch::zeros({n}));
  pending_.assign(plan_.buckets.size(), 0);
  ready_.assign(plan_.buckets.size(), 0);
  filled_.assign(params_.size(), 0);
  works_.resize(plan_.buckets.size());
  timings_.resize(plan_.buckets.size());
  std::vector<BucketLayout> layouts(plan_.buckets.size());
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    for (int64_t i : plan_.buckets[b])
      layouts[b].push_back({plan_.offset_of[i], params_[i].sizes().vec()});
  hook_->setup(layouts);

  if (options_.broadcast_initial_state) broadcast_state();

  hooks_ =
      std::make_unique<GradReadyHooks>(params_, [this](int64_t param) { on_grad_ready(param); });
}

DataParallel::~DataParallel() = default;

void DataParallel::broadcast_state() {
  std::vector<at::Tensor> state = module_.parameters();
  for (auto& b : module_.buffers()) state.push_back(b);
  broadcast_from_rank0(comm_, state);
}

void DataParallel::broadcast_buffers() { broadcast_from_rank0(comm_, module_.buffers()); }

void broadcast_from_rank0(comm::Communicator& comm, const std::vector<at::Tensor>& state) {
  torch::NoGradGuard no_grad;
  if (state.empty() || comm.size() == 1) return;
  // One flat buffer per dtype keeps this to a handful of broadcasts.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (auto& t : state) by_type[t.scalar_type()].push_back(t);
  for (auto& [type, ts] : by_type) {
    at::Tensor flat = core::flatten(ts, type);
    comm.broadcast(flat, 0)->wait();
    core::unflatten_into(flat, ts);
  }
}

void DataParallel::begin_step() {
  step_active_ = true;
  norms_ = {};
  next_launch_ = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    pending_[b] = static_cast<int64_t>(plan_.buckets[b].size());
    ready_[b] = 0;
    works_[b].reset();
  }
  std::fill(filled_.begin(), filled_.end(), 0);
}

void DataParallel::on_grad_ready(int64_t param) {
  if (!sync_) return;
  if (!step_active_) begin_step();
  if (filled_[param]) return;  // a parameter used twice fires once per use
  filled_[param] = 1;
  const int64_t b = plan_.bucket_of[param];
  const at::Tensor& grad = params_[param].grad();
  at::Tensor slot = buffers_[b].narrow(0, plan_.offset_of[param], params_[param].numel());
  if (grad.defined())
    slot.copy_(grad.reshape({-1}));
  else
    slot.zero_();
  if (--pending_[b] == 0) {
    ready_[b] = 1;
    launch_ready_buckets();
  }
}

void DataParallel::launch_ready_buckets() {
  while (next_launch_ < static_cast<int64_t>(plan_.buckets.size()) && ready_[next_launch_])
    launch(next_launch_++);
}

void DataParallel::launch(int64_t bucket) {
  timings_[bucket].launched = std::chrono::steady_clock::now();
  if (measure_norms_)  // before the hook: it may compress the bucket in place
    norms_.local_sq += buffers_[bucket].square().sum(at::kDouble).item<double>();
  works_[bucket] = hook_->reduce(comm_, buffers_[bucket], bucket, step_);
}

void DataParallel::finish() {
  if (!sync_) {  // nothing reduced: no bucket timings for this step
    std::fill(timings_.begin(), timings_.end(), BucketTiming{});
    return;
  }
  // No gradient arrived at all (e.g. an empty batch): still take part in the collectives so
  // that the other ranks are not left waiting.
  if (!step_active_) begin_step();
  // Parameters that received no gradient this step contribute zeros.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (filled_[i]) continue;
    const int64_t b = plan_.bucket_of[i];
    buffers_[b].narrow(0, plan_.offset_of[i], params_[i].numel()).zero_();
    filled_[i] = 1;
    if (--pending_[b] == 0) ready_[b] = 1;
  }
  launch_ready_buckets();
  KRAB_CHECK(next_launch_ == static_cast<int64_t>(plan_.buckets.size()));
  step_active_ = false;
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    works_[b]->wait();
    timings_[b].done = std::chrono::steady_clock::now();
    if (measure_norms_) norms_.global_sq += buffers_[b].square().sum(at::kDouble).item<double>();
    for (int64_t i : plan_.buckets[b]) {
      at::Tensor& p = params_[i];
      at::Tensor avg = buffers_[b].narrow(0, plan_.offset_of[i], p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(avg);
      else
        p.mutable_grad() = avg.clone();
    }
  }
  norms_.valid = measure_norms_;
  ++step_;
}

}  // namespace krab::parallel
