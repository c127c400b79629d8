#include "parallel/buckets.h"

#include "parallel/comm_hook.h"

namespace krab::parallel {

BucketPlan plan_buckets(const std::vector<int64_t>& numel, int64_t element_bytes,
                        int64_t bucket_bytes) {
  BucketPlan plan;
  const int64_t n = static_cast<int64_t>(numel.size());
  plan.bucket_of.assign(n, -1);
  plan.offset_of.assign(n, 0);
  int64_t filled = 0;  // bytes in the open bucket
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t bytes = numel[i] * element_bytes;
    const bool open_is_full = !plan.buckets.empty() && filled > 0 && filled + bytes > bucket_bytes;
    if (plan.buckets.empty() || open_is_full) {
      plan.buckets.emplace_back();
      plan.bucket_numel.push_back(0);
      filled = 0;
    }
    const int64_t b = static_cast<int64_t>(plan.buckets.size()) - 1;
    plan.buckets[b].push_back(i);
    plan.bucket_of[i] = b;
    plan.offset_of[i] = plan.bucket_numel[b];
    plan.bucket_numel[b] += numel[i];
    filled += bytes;
  }
  return plan;
}

int64_t ParamSlot::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace krab::parallel
