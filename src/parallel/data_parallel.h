// DataParallel: synchronous data-parallel training of one torch::nn::Module.
//
// Every rank holds a full replica. At construction rank 0's parameters and buffers are
// broadcast so all replicas start equal. During backward, a gradient-ready hook on each
// parameter's gradient accumulator copies the gradient into its bucket (see buckets.h); the
// moment a bucket's last gradient arrives, the bucket's reduction starts through the
// CommHook, overlapping communication with the rest of backward. Buckets are launched
// strictly in bucket order, so every rank issues the same collectives in the same order even
// if autograd's order were to differ. finish() waits for every bucket and writes the averaged
// gradients back into each parameter's .grad(); call it after backward and before the
// optimizer step.
//
// Gradient accumulation: set_sync(false) for the non-final micro-steps; their backward only
// accumulates locally, with no communication. The final micro-step (set_sync(true)) reduces
// the accumulated gradient. A parameter that got no gradient in a step contributes zeros.
//
// Usage:
//   DataParallel dp(model, comm, {/*bucket_mb=*/25});
//   loss.backward();  dp.finish();  optimizer.step();
//
// Thread safety: one training thread. The module must outlive the DataParallel, which must be
// destroyed before the module's parameters are replaced. Destroying a DataParallel and
// building another on the same module (mid-training) is safe: the old engine's gradient hooks
// stay registered in LibTorch but do nothing.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "parallel/buckets.h"
#include "parallel/comm_hook.h"
#include "parallel/grad_hooks.h"

namespace krab::parallel {

// Copies rank 0's `state` (any dtypes) into every rank's tensors in place, one flat broadcast
// per dtype. Collective; nothing is sent for an empty list or a group of one.
void broadcast_from_rank0(comm::Communicator& comm, const std::vector<at::Tensor>& state);

struct DataParallelOptions {
  double bucket_mb = 25.0;  // bucket cap in MiB; 0 = one bucket per parameter
  bool broadcast_initial_state = true;
};

class DataParallel {
 public:
  DataParallel(torch::nn::Module& module, comm::Communicator& comm, DataParallelOptions options,
               std::unique_ptr<CommHook> hook = nullptr);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Whether the next backward communicates (see class comment).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  // Waits for all bucket reductions of this step and installs the averaged gradients. No-op
  // when the step did not sync. Rethrows the first communication error.
  void finish();

  // Broadcasts rank 0's parameters and buffers to all ranks (also done at construction).
  void broadcast_state();
  // Broadcasts rank 0's buffers only (BatchNorm's running statistics, which each replica
  // updates from its own slice of the batch): what DDP's broadcast_buffers does before every
  // forward. Nothing is sent for a module without buffers.
  void broadcast_buffers();

  // Each bucket's reduction in the last step that synced: when it was launched (its last
  // gradient arrived during backward, or finish() launched it) and when finish()'s wait for it
  // returned. Index = bucket.
  struct BucketTiming {
    std::chrono::steady_clock::time_point launched, done;
  };
  const std::vector<BucketTiming>& bucket_timings() const { return timings_; }

  // The squared L2 norms of the last synced step's gradient: this rank's own (as its buckets
  // were launched, before any compression) and the group's average (after finish()). What
  // the gradient noise scale is estimated from (train/noise_scale.h). Off by default: each is
  // one more pass over the gradients.
  struct GradientNorms {
    double local_sq = 0, global_sq = 0;
    bool valid = false;
  };
  void measure_norms(bool on) { measure_norms_ = on; }
  const GradientNorms& gradient_norms() const { return norms_; }

  const BucketPlan& plan() const { return plan_; }
  int64_t steps() const { return step_; }
  const CommHook& hook() const { return *hook_; }

 private:
  void begin_step();
  void on_grad_ready(int64_t param);
  void launch_ready_buckets();
  void launch(int64_t bucket);

  torch::nn::Module& module_;
  comm::Communicator& comm_;
  DataParallelOptions options_;
  std::unique_ptr<CommHook> hook_;
  std::vector<at::Tensor> params_;
  BucketPlan plan_;
  std::vector<at::Tensor> buffers_;  // one flat fp32 buffer per bucket
  std::vector<int64_t> pending_;     // gradients still missing per bucket
  std::vector<char> ready_;          // bucket fully filled
  std::vector<char> filled_;         // parameter copied this step
  std::vector<comm::WorkPtr> works_;
  std::vector<BucketTiming> timings_;
  bool measure_norms_ = false;
  GradientNorms norms_;
  int64_t next_launch_ = 0;
  bool sync_ = true;
  bool step_active_ = false;
  int64_t step_ = 0;
  // Last member: destroyed first, so no hook reaches a half-destroyed engine.
  std::unique_ptr<GradReadyHooks> hooks_;
};

}  // namespace krab::parallel
