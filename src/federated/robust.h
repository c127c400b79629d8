// Robust aggregation: combining client updates when some clients may be faulty or malicious.
//
// Plain averaging lets one client move the global model anywhere (send -1e9 and the mean
// follows). The aggregators here bound that influence at some cost in statistical efficiency:
//
//   mean           weighted mean; no robustness, the baseline (what FedAvg does).
//   median         coordinate-wise median (Yin et al. 2018). With an even count, the average of
//                  the two middle values. Tolerates up to just under half the clients being
//                  arbitrary, per coordinate.
//   trimmed_mean   coordinate-wise beta-trimmed mean (Yin et al. 2018): per coordinate, drop the
//                  floor(beta n) smallest and the floor(beta n) largest values and average the
//                  rest. beta in [0, 0.5); beta = 0 is the plain mean.
//   krum           Blanchard et al. 2017. Each update's score is the sum of its squared L2
//                  distances to its n - f - 2 nearest other updates; the update with the lowest
//                  score is the result. Needs n > 2f + 2, where f bounds the byzantine clients.
//   multi_krum     the same scores; the mean of the m lowest-scoring updates (1 <= m <= n - f).
//                  m = 1 is krum; m = n - f averages all the plausible ones.
// Ties (equal scores, equal values) are broken by position in the input, so results are
// deterministic. Weights (e.g. num_examples) are used by mean only: the robust rules treat
// every client alike (a weight is a claim the client makes, and so is attackable too).
//
// validate_update() is the first line of defence, applied to each update before any of these:
// it rejects malformed updates (wrong size or dtype, NaN/Inf, an absurd norm) with a reason a
// log line can show.
//
// Inputs: n >= 1 updates, each a 1-D float32 tensor of the same size on the same device; the
// result is a new tensor of that size. All functions are pure; an Aggregator is immutable after
// construction, so one object may be shared between threads. Caller mistakes (no updates,
// mismatched sizes, beta or f out of range) throw krab::InvalidArgument naming the argument.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace krab::federated {

// Weighted mean sum w_i u_i / sum w_i. `weights` empty means all equal; otherwise one per
// update, each finite and >= 0, with a positive sum.
at::Tensor mean(const std::vector<at::Tensor>& updates, const std::vector<double>& weights = {});
at::Tensor median(const std::vector<at::Tensor>& updates);
at::Tensor trimmed_mean(const std::vector<at::Tensor>& updates, double beta);

// Krum scores, one per update (lower = more central). f >= 0 and n > 2f + 2.
std::vector<double> krum_scores(const std::vector<at::Tensor>& updates, int64_t f);
// Indices of the m lowest-scoring updates, ascending by score (ties: lower index first).
std::vector<int64_t> krum_select(const std::vector<at::Tensor>& updates, int64_t f, int64_t m);
at::Tensor krum(const std::vector<at::Tensor>& updates, int64_t f);
at::Tensor multi_krum(const std::vector<at::Tensor>& updates, int64_t f, int64_t m);

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  virtual std::string name() const = 0;
  // `weights`: as for mean(); ignored by the robust rules (but still checked for count).
  virtual at::Tensor aggregate(const std::vector<at::Tensor>& updates,
                               const std::vector<double>& weights = {}) const = 0;
};

struct AggregatorOptions {
  double trim_beta = 0.1;   // trimmed_mean
  int64_t byzantine_f = 0;  // krum, multi_krum: the number of byzantine clients tolerated
  int64_t krum_m = 1;       // multi_krum: how many updates to average
};

// `name`: mean | median | trimmed_mean | krum | multi_krum; anything else throws
// InvalidArgument listing these. Options are range-checked here where the rule allows it
// (beta in [0, 0.5), f >= 0, m >= 1); the checks that depend on n happen in aggregate().
std::unique_ptr<Aggregator> make_aggregator(const std::string& name,
                                            const AggregatorOptions& options = {});

// Checks one client's update before aggregation. Returns "" if it is acceptable, otherwise a
// one-line reason that starts with the client id and gives the numbers, e.g.
//   "client 'c7': update has 1000 elements, expected 1024"
//   "client 'c7': update has 3 non-finite values (2 NaN, 1 Inf), first at index 17"
//   "client 'c7': update norm 84.2 exceeds the limit 10"
// Checks, in order: defined, 1-D float32, `expected_numel` elements, all finite, L2 norm <=
// max_norm. `max_norm` > 0; pass infinity to skip the norm check. Never throws for a bad
// update (that is what the string is for); throws InvalidArgument for a bad max_norm or
// expected_numel < 0.
std::string validate_update(const std::string& client_id, const at::Tensor& update,
                            int64_t expected_numel, double max_norm);

}  // namespace krab::federated
