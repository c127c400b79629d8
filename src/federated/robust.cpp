// Robust aggregation rules and update validation. Every rule works on the [n, d] stack of the
// updates; the coordinate-wise ones sort along dim 0, Krum needs the n x n distance matrix.
#include "federated/robust.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/errors.h"

namespace krab::federated {
namespace {

// Checks the update list and returns the [n, d] stack.
at::Tensor stack_updates(const std::vector<at::Tensor>& updates, const char* rule) {
  KRAB_CHECK_ARG(!updates.empty(), rule, ": no updates to aggregate");
  const at::Tensor& first = updates.front();
  for (size_t i = 0; i < updates.size(); ++i) {
    const at::Tensor& u = updates[i];
    KRAB_CHECK_ARG(u.defined() && u.dim() == 1 && u.scalar_type() == at::kFloat, rule, ": update ",
                   i, " must be a 1-D float32 tensor");
    KRAB_CHECK_ARG(u.numel() == first.numel(), rule, ": update ", i, " has ", u.numel(),
                   " elements, update 0 has ", first.numel());
    KRAB_CHECK_ARG(u.device() == first.device(), rule, ": update ", i, " is on ", u.device(),
                   ", update 0 on ", first.device());
  }
  return at::stack(updates);
}

// floor(beta * n), with a little slack so that e.g. 0.29 * 100 counts as 29, not 28.
int64_t trim_count(double beta, int64_t n) {
  return static_cast<int64_t>(std::floor(beta * static_cast<double>(n) + 1e-9));
}

void check_beta(double beta) {
  KRAB_CHECK_ARG(beta >= 0 && beta < 0.5, "trimmed_mean: beta must be in [0, 0.5), got ", beta);
}

void check_krum_args(int64_t n, int64_t f) {
  KRAB_CHECK_ARG(f >= 0, "krum: f (byzantine clients) must be >= 0, got ", f);
  KRAB_CHECK_ARG(n > 2 * f + 2, "krum: needs n > 2f + 2 updates, got n = ", n, " with f = ", f,
                 " (at least ", 2 * f + 3, " updates)");
}

void check_weight_count(const std::vector<double>& weights, size_t n, const std::string& rule) {
  KRAB_CHECK_ARG(weights.empty() || weights.size() == n, rule, ": ", weights.size(),
                 " weights for ", n, " updates");
}

}  // namespace

at::Tensor mean(const std::vector<at::Tensor>& updates, const std::vector<double>& weights) {
  const at::Tensor x = stack_updates(updates, "mean");
  if (weights.empty()) return x.mean(0);
  check_weight_count(weights, updates.size(), "mean");
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    KRAB_CHECK_ARG(std::isfinite(weights[i]) && weights[i] >= 0, "mean: weight ", i, " is ",
                   weights[i], ", must be finite and >= 0");
    total += weights[i];
  }
  KRAB_CHECK_ARG(total > 0, "mean: the weights sum to 0");
  at::Tensor out = at::zeros_like(updates.front());
  for (size_t i = 0; i < updates.size(); ++i) {
    if (weights[i] > 0) out.add_(updates[i], weights[i] / total);
  }
  return out;
}

at::Tensor median(const std::vector<at::Tensor>& updates) {
  const at::Tensor x = stack_updates(updates, "median");
  const int64_t n = x.size(0);
  // torch's median returns the lower of the two middle values for even n; the statistical
  // median (and Yin et al.'s) is their average.
  const at::Tensor sorted = std::get<0>(x.sort(0));
  if (n % 2 == 1) return sorted[n / 2].clone();
  return (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

at::Tensor trimmed_mean(const std::vector<at::Tensor>& updates, double beta) {
  check_beta(beta);
  const at::Tensor x = stack_updates(updates, "trimmed_mean");
  const int64_t n = x.size(0);
  const int64_t k = trim_count(beta, n);
  // beta < 0.5 guarantees n - 2k >= 1.
  KRAB_CHECK(n - 2 * k >= 1, "n=", n, " k=", k);
  if (k == 0) return x.mean(0);
  return std::get<0>(x.sort(0)).narrow(0, k, n - 2 * k).mean(0);
}

std::vector<double> krum_scores(const std::vector<at::Tensor>& updates, int64_t f) {
  const at::Tensor x = stack_updates(updates, "krum").to(at::kDouble);
  const int64_t n = x.size(0);
  check_krum_args(n, f);
  // Row by row as differences rather than |a|^2 + |b|^2 - 2ab: the latter cancels badly when
  // the honest updates are close together and far from the origin, which is exactly when the
  // ranking matters.
  std::vector<at::Tensor> rows;
  rows.reserve(n);
  for (int64_t i = 0; i < n; ++i) rows.push_back((x - x[i]).pow(2).sum(1));
  const at::Tensor d = at::stack(rows).cpu().contiguous();
  const double* dp = d.data_ptr<double>();
  const int64_t neighbours = n - f - 2;
  std::vector<double> scores(n);
  std::vector<double> row;
  for (int64_t i = 0; i < n; ++i) {
    row.clear();
    for (int64_t j = 0; j < n; ++j) {
      if (j != i) row.push_back(dp[i * n + j]);
    }
    std::partial_sort(row.begin(), row.begin() + neighbours, row.end());
    scores[i] = std::accumulate(row.begin(), row.begin() + neighbours, 0.0);
  }
  return scores;
}

std::vector<int64_t> krum_select(const std::vector<at::Tensor>& updates, int64_t f, int64_t m) {
  const std::vector<double> scores = krum_scores(updates, f);
  const auto n = static_cast<int64_t>(scores.size());
  KRAB_CHECK_ARG(m >= 1 && m <= n - f, "multi_krum: m must be in [1, n - f] = [1, ", n - f,
                 "], got ", m);
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return scores[a] < scores[b]; });
  idx.resize(m);
  return idx;
}

at::Tensor krum(const std::vector<at::Tensor>& updates, int64_t f) {
  return updates[krum_select(updates, f, 1).front()].clone();
}

at::Tensor multi_krum(const std::vector<at::Tensor>& updates, int64_t f, int64_t m) {
  std::vector<at::Tensor> chosen;
  for (int64_t i : krum_select(updates, f, m)) chosen.push_back(updates[i]);
  return at::stack(chosen).mean(0);
}

namespace {

class MeanAggregator : public Aggregator {
 public:
  std::string name() const override { return "mean"; }
  at::Tensor aggregate(const std::vector<at::Tensor>& updates,
                       const std::vector<double>& weights) const override {
    return mean(updates, weights);
  }
};

class MedianAggregator : public Aggregator {
 public:
  std::string name() const override { return "median"; }
  at::Tensor aggregate(const std::vector<at::Tensor>& updates,
                       const std::vector<double>& weights) const override {
    check_weight_count(weights, updates.size(), name());
    return median(updates);
  }
};

class TrimmedMeanAggregator : public Aggregator {
 public:
  explicit TrimmedMeanAggregator(double beta) : beta_(beta) { check_beta(beta); }
  std::string name() const override { return "trimmed_mean"; }
  at::Tensor aggregate(const std::vector<at::Tensor>& updates,
                       const std::vector<double>& weights) const override {
    check_weight_count(weights, updates.size(), name());
    return trimmed_mean(updates, beta_);
  }

 private:
  double beta_;
};

class KrumAggregator : public Aggregator {
 public:
  KrumAggregator(std::string name, int64_t f, int64_t m) : name_(std::move(name)), f_(f), m_(m) {
    KRAB_CHECK_ARG(f >= 0, name_, ": f (byzantine clients) must be >= 0, got ", f);
    KRAB_CHECK_ARG(m >= 1, name_, ": m must be >= 1, got ", m);
  }
  std::string name() const override { return name_; }
  at::Tensor aggregate(const std::vector<at::Tensor>& updates,
                       const std::vector<double>& weights) const override {
    check_weight_count(weights, updates.size(), name_);
    return m_ == 1 ? krum(updates, f_) : multi_krum(updates, f_, m_);
  }

 private:
  std::string name_;
  int64_t f_, m_;
};

}  // namespace

std::unique_ptr<Aggregator> make_aggregator(const std::string& name,
                                            const AggregatorOptions& options) {
  if (name == "mean") return std::make_unique<MeanAggregator>();
  if (name == "median") return std::make_unique<MedianAggregator>();
  if (name == "trimmed_mean") return std::make_unique<TrimmedMeanAggregator>(options.trim_beta);
  if (name == "krum") return std::make_unique<KrumAggregator>("krum", options.byzantine_f, 1);
  if (name == "multi_krum") {
    return std::make_unique<KrumAggregator>("multi_krum", options.byzantine_f, options.krum_m);
  }
  throw InvalidArgument(str_cat("unknown aggregator '", name,
                                "'; known: mean, median, trimmed_mean, krum, multi_krum"));
}

std::string validate_update(const std::string& client_id, const at::Tensor& update,
                            int64_t expected_numel, double max_norm) {
  KRAB_CHECK_ARG(max_norm > 0,
                 "validate_update: max_norm must be > 0 (infinity disables the "
                 "norm check), got ",
                 max_norm);
  KRAB_CHECK_ARG(expected_numel >= 0, "validate_update: expected_numel must be >= 0, got ",
                 expected_numel);
  const std::string who = str_cat("client '", client_id, "': ");
  if (!update.defined()) return who + "update is missing (undefined tensor)";
  if (update.scalar_type() != at::kFloat || update.dim() != 1) {
    return str_cat(who, "update must be a 1-D float32 tensor, got ", update.scalar_type(),
                   " of shape ", update.sizes());
  }
  if (update.numel() != expected_numel) {
    return str_cat(who, "update has ", update.numel(), " elements, expected ", expected_numel);
  }
  const at::Tensor bad = at::logical_not(at::isfinite(update));
  const int64_t n_bad = bad.sum().item<int64_t>();
  if (n_bad > 0) {
    const int64_t n_nan = at::isnan(update).sum().item<int64_t>();
    const int64_t first = bad.nonzero()[0][0].item<int64_t>();
    return str_cat(who, "update has ", n_bad, " non-finite values (", n_nan, " NaN, ",
                   n_bad - n_nan, " Inf), first at index ", first);
  }
  if (std::isfinite(max_norm)) {
    // In double: a float32 norm of large-but-finite values can overflow to inf.
    const double norm =
        at::linalg_vector_norm(update, 2, c10::nullopt, false, at::kDouble).item<double>();
    if (norm > max_norm) {
      return str_cat(who, "update norm ", norm, " exceeds the limit ", max_norm);
    }
  }
  return "";
}

}  // namespace krab::federated
