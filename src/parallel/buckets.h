// Gradient bucket planning: a pure function, testable without a network.
//
// Parameters are grouped into buckets of about `bucket_bytes` in *reverse registration order*:
// backward produces the gradients of the last layers first, so the first bucket fills first
// and its all-reduce starts while backward is still computing earlier layers. A parameter is
// never split across buckets; a parameter larger than the cap gets a bucket of its own.
#pragma once

#include <cstdint>
#include <vector>

namespace krab::parallel {

struct BucketPlan {
  // buckets[b] lists parameter indices (registration order numbering) in the order they sit
  // in the bucket's flat buffer. Bucket 0 is launched first.
  std::vector<std::vector<int64_t>> buckets;
  // For every parameter: its bucket and its element offset inside that bucket.
  std::vector<int64_t> bucket_of;
  std::vector<int64_t> offset_of;
  std::vector<int64_t> bucket_numel;
};

// `numel[i]` is parameter i's element count, `element_bytes` the size of one element.
// bucket_bytes <= 0 gives every parameter a bucket of its own.
BucketPlan plan_buckets(const std::vector<int64_t>& numel, int64_t element_bytes,
                        int64_t bucket_bytes);

}  // namespace krab::parallel
