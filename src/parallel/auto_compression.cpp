#include "parallel/auto_compression.h"

#include <torch/torch.h>

#include <deque>
#include <mutex>

#include "compress/compressor.h"
#include "core/errors.h"
#include "parallel/compression_hook.h"

namespace krab::parallel {
namespace {

using Clock = std::chrono::steady_clock;

compress::CompressionOptions with_kind(compress::CompressionOptions o, const std::string& name) {
  o.kind = compress::parse_compressor(name);
  o.automatic = false;
  return o;
}

std::unique_ptr<CommHook> make_candidate_hook(const compress::CompressionOptions& options,
                                              const std::string& name) {
  if (name == "none") return std::make_unique<AllreduceHook>();
  return make_compression_hook(with_kind(options, name));
}

}  // namespace

AutoPolicy::AutoPolicy(std::vector<AutoCandidate> candidates, double target)
    : candidates_(std::move(candidates)), target_(target) {
  KRAB_CHECK(!candidates_.empty());
}

size_t AutoPolicy::decide(size_t current, double exposed_share) {
  if (exposed_share <= target_) return current;
  candidates_[current].measured_slow = true;
  const double per_byte = exposed_share / candidates_[current].bytes;
  // The least lossy candidate, not found slow, predicted within target; topk only once powersgd
  // was found slow (the "powersgd" entry is before it).
  size_t least_bytes = current;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const AutoCandidate& c = candidates_[i];
    if (c.measured_slow) continue;
    if (c.name == "topk" && i > 0 && !candidates_[i - 1].measured_slow) continue;
    if (c.bytes < candidates_[least_bytes].bytes || candidates_[least_bytes].measured_slow)
      least_bytes = i;
    if (per_byte * c.bytes <= target_) return i;
  }
  return least_bytes;
}

std::vector<AutoCandidate> auto_candidates(const std::vector<BucketLayout>& buckets,
                                           const compress::CompressionOptions& options) {
  int64_t total = 0;
  for (const BucketLayout& b : buckets)
    for (const ParamSlot& p : b) total += p.numel();
  std::vector<AutoCandidate> out{{"none", 1.0}};
  for (const char* name : {"fp16", "powersgd", "topk"}) {
    const auto compressor = compress::make_compressor(with_kind(options, name));
    double bytes = 0;  // per step, this candidate's
    for (const BucketLayout& b : buckets)
      for (const ParamSlot& p : b) {
        const double n = static_cast<double>(p.numel());
        if (!compressor->compressible(p.shape)) {
          bytes += 4 * n;
        } else if (std::string(name) == "fp16") {
          bytes += 2 * n;
        } else if (std::string(name) == "powersgd") {
          const double rows = static_cast<double>(p.shape[0]);
          bytes += 4.0 * static_cast<double>(options.rank) * (rows + n / rows);
        } else {
          bytes += 8.0 * options.ratio * n;  // a value and an int32 index each
        }
      }
    out.push_back({name, total > 0 ? bytes / (4.0 * static_cast<double>(total)) : 1.0});
  }
  return out;
}

// What the hook measures: per step, the seconds the training thread spent in the buckets'
// waits, and the step's period; the last `window` steps kept.
struct AutoCompressionHook::Timing {
  std::mutex mu;
  double waited = 0;  // this step's, so far
  Clock::time_point step_start;
  std::deque<std::pair<double, double>> steps;  // (period, waited), newest last
};

namespace {

// A bucket's Work whose first wait() adds its blocked time to the step's.
class TimedWork : public comm::Work {
 public:
  TimedWork(comm::WorkPtr inner, std::shared_ptr<void> timing, double* waited, std::mutex* mu)
      : inner_(std::move(inner)), keep_(std::move(timing)), waited_(waited), mu_(mu) {}
  void wait() override {
    const auto t0 = Clock::now();
    inner_->wait();
    if (counted_) return;
    counted_ = true;
    std::lock_guard<std::mutex> lock(*mu_);
    *waited_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  comm::WorkPtr inner_;
  std::shared_ptr<void> keep_;
  double* waited_;
  std::mutex* mu_;
  bool counted_ = false;
};

}  // namespace

AutoCompressionHook::AutoCompressionHook(compress::CompressionOptions options,
                                         AutoOptions auto_options)
    : options_(std::move(options)),
      auto_(auto_options),
      hook_(std::make_unique<AllreduceHook>()),
      timing_(std::make_shared<Timing>()),
      next_check_(auto_options.first_check) {}

AutoCompressionHook::~AutoCompressionHook() = default;

std::string AutoCompressionHook::name() const {
  return "auto: " + (policy_ ? policy_->candidates()[current_].name : std::string("none"));
}

void AutoCompressionHook::setup(const std::vector<BucketLayout>& buckets) {
  layouts_ = buckets;
  policy_ = std::make_unique<AutoPolicy>(auto_candidates(buckets, options_), auto_.target);
  hook_->setup(layouts_);
}

comm::WorkPtr AutoCompressionHook::reduce(comm::Communicator& comm, at::Tensor& bucket,
                                          int64_t bucket_index, int64_t step) {
  if (step != last_step_) on_new_step(comm, step);
  return std::make_shared<TimedWork>(hook_->reduce(comm, bucket, bucket_index, step), timing_,
                                     &timing_->waited, &timing_->mu);
}

void AutoCompressionHook::on_new_step(comm::Communicator& comm, int64_t step) {
  const auto now = Clock::now();
  double share = -1;
  {
    std::lock_guard<std::mutex> lock(timing_->mu);
    if (last_step_ >= 0) {
      timing_->steps.emplace_back(std::chrono::duration<double>(now - timing_->step_start).count(),
                                  timing_->waited);
      while (static_cast<int64_t>(timing_->steps.size()) > auto_.window) timing_->steps.pop_front();
    }
    timing_->waited = 0;
    timing_->step_start = now;
    if (step >= next_check_ && static_cast<int64_t>(timing_->steps.size()) >= auto_.window) {
      double period = 0, waited = 0;
      for (const auto& [p, w] : timing_->steps) {
        period += p;
        waited += w;
      }
      share = period > 0 ? waited / period : 0;
    }
  }
  last_step_ = step;
  if (share < 0) return;
  // Every rank decides on the same number: the least share, the slowest rank's.
  auto t = torch::tensor({share}, torch::kFloat64);
  comm.allreduce(t, comm::ReduceOp::kMin)->wait();
  share = t.item<double>();
  const size_t next = policy_->decide(current_, share);
  decisions_.push_back({{"step", step},
                        {"exposed_share", share},
                        {"ran", policy_->candidates()[current_].name},
                        {"choice", policy_->candidates()[next].name}});
  if (next != current_) switch_to(next);
  next_check_ = step + auto_.check_every;
}

void AutoCompressionHook::switch_to(size_t candidate) {
  current_ = candidate;
  hook_ = make_candidate_hook(options_, policy_->candidates()[candidate].name);
  hook_->setup(layouts_);
  std::lock_guard<std::mutex> lock(timing_->mu);
  timing_->steps.clear();  // the next window measures the new compressor alone
}

}  // namespace krab::parallel
