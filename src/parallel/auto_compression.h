// comm.compression: auto — DataParallel's comm hook that picks the gradient compression from
// what communication costs this run, and checks again as the run goes (docs/monitoring.md,
// "Compression that adapts").
//
// The candidates, from the least lossy: none (fp32 all-reduce), fp16, powersgd (rank
// comm.rank), topk (comm.ratio). The run starts with none. Each rank measures, per step, the
// time it spent blocked in the buckets' waits (the communication backward did not hide, plus
// any wait for a slower rank) against the step's period (bucket 0's launch to the next step's).
// Every `check_every` steps, over the last `window` steps, the ranks all-reduce the least of
// their exposed shares — the slowest rank waits for nobody, so its share is the communication
// alone (train/bottleneck.h's reading) — and AutoPolicy decides; every rank then runs the same
// compressor from the next step on.
//
// AutoPolicy: a share of at most `target` (a tenth of the step) is fine. Above it, the next
// choice is the least lossy candidate whose predicted share — the measured one scaled by its
// bytes against the current compressor's (AutoCandidate::bytes, from the buckets' shapes) —
// is within target; when none is, the one that sends least. A candidate measured above target
// is never taken again (no flapping between a compressor and one found too slow). topk, the
// lossiest (−0.8 points at 2 epochs, docs/benchmarks.md), is only taken while powersgd was
// measured above the target.
//
// A switch starts the new compressor fresh (its error feedback from zero): the previous
// one's residual, a few steps' worth of what it had not sent, is dropped.
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compress/options.h"
#include "parallel/comm_hook.h"

namespace krab::parallel {

struct AutoCandidate {
  std::string name;  // "none", "fp16", "powersgd", "topk"
  double bytes = 1;  // bytes sent per step against none's
  bool measured_slow = false;
};

// The decision alone (pure, for tests). `candidates` in order, least lossy first.
class AutoPolicy {
 public:
  explicit AutoPolicy(std::vector<AutoCandidate> candidates, double target = 0.10);
  // The candidate to run next, given the exposed share measured while `current` ran.
  size_t decide(size_t current, double exposed_share);
  const std::vector<AutoCandidate>& candidates() const { return candidates_; }
  double target() const { return target_; }

 private:
  std::vector<AutoCandidate> candidates_;
  double target_;
};

// Bytes per step of each candidate against fp32, for buckets of these parameters: parameters
// below min_numel travel uncompressed; powersgd sends rank × (rows + cols) per matrix it can
// shrink (rows = the first dimension); topk sends ratio of the values with an int32 index each.
std::vector<AutoCandidate> auto_candidates(const std::vector<BucketLayout>& buckets,
                                           const compress::CompressionOptions& options);

struct AutoOptions {
  int64_t first_check = 30;  // the first decision, after this many steps of none
  int64_t check_every = 200;
  int64_t window = 20;   // steps measured before each check
  double target = 0.10;  // AutoPolicy's: the exposed share that is fine
};

class AutoCompressionHook : public CommHook {
 public:
  // `options`: the job's compression options (comm.rank, comm.ratio, ... for the candidates).
  AutoCompressionHook(compress::CompressionOptions options, AutoOptions auto_options = {});
  ~AutoCompressionHook() override;
  // "auto: <the compressor running>".
  std::string name() const override;
  void setup(const std::vector<BucketLayout>& buckets) override;
  comm::WorkPtr reduce(comm::Communicator& comm, at::Tensor& bucket, int64_t bucket_index,
                       int64_t step) override;
  // The decisions so far, for the report: [{"step", "exposed_share", "choice"}].
  nlohmann::json decisions() const { return decisions_; }

 private:
  struct Timing;
  void on_new_step(comm::Communicator& comm, int64_t step);
  void switch_to(size_t candidate);

  compress::CompressionOptions options_;
  AutoOptions auto_;
  std::vector<BucketLayout> layouts_;
  std::unique_ptr<AutoPolicy> policy_;
  size_t current_ = 0;
  std::unique_ptr<CommHook> hook_;  // the current candidate's
  std::shared_ptr<Timing> timing_;
  int64_t last_step_ = -1;
  int64_t next_check_ = 0;
  nlohmann::json decisions_ = nlohmann::json::array();
};

}  // namespace krab::parallel
