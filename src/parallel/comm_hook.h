// CommHook: the seam where gradient reduction is decided.
//
// DataParallel hands each full bucket (a flat fp32 tensor holding this rank's gradients) to
// its hook; the hook starts whatever communication it wants and returns a Work. When that
// Work's wait() returns, the bucket must hold the gradient average over all ranks (or the
// hook's approximation of it: compressors, local SGD and other strategies plug in here
// without touching the engine). Hooks are called from the training thread, in bucket order,
// identically on every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace krab::parallel {

// Where one parameter's gradient lies in its bucket.
struct ParamSlot {
  int64_t offset = 0;          // in elements, from the start of the bucket
  std::vector<int64_t> shape;  // the parameter's shape (numel = product)
  int64_t numel() const;
};
using BucketLayout = std::vector<ParamSlot>;

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Called once by DataParallel before the first reduce(), with every bucket's layout (index =
  // bucket_index), so hooks can treat parameters by shape (PowerSGD's matrices) or size.
  virtual void setup(const std::vector<BucketLayout>& buckets) {}
  // `bucket_index` is stable across steps (hooks with per-bucket state, e.g. error feedback,
  // key on it). `step` counts optimizer steps from 0.
  virtual comm::WorkPtr reduce(comm::Communicator& comm, at::Tensor& bucket, int64_t bucket_index,
                               int64_t step) = 0;
};

// Plain fp32 all-reduce average: what PyTorch DDP does by default.
class AllreduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  comm::WorkPtr reduce(comm::Communicator& comm, at::Tensor& bucket, int64_t bucket_index,
                       int64_t step) override {
    return comm.allreduce(bucket, comm::ReduceOp::kAvg);
  }
};

}  // namespace krab::parallel
