#include "data/partition.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/errors.h"
#include "data/rng.h"

namespace krab::data {
namespace {

std::vector<int64_t> labels_of(const at::Tensor& labels, int64_t num_classes) {
  KRAB_CHECK_ARG(labels.defined() && labels.dim() == 1 && labels.scalar_type() == at::kLong,
                 "partition: labels must be a 1-D int64 tensor");
  at::Tensor l = labels.contiguous().cpu();
  std::vector<int64_t> out(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
  for (size_t i = 0; i < out.size(); ++i)
    KRAB_CHECK_ARG(out[i] >= 0 && out[i] < num_classes, "partition: label ", out[i], " of example ",
                   i, " is outside [0, ", num_classes, ")");
  return out;
}

std::vector<std::vector<int64_t>> iid(int64_t n, int64_t clients, std::mt19937_64& rng) {
  const std::vector<int64_t> perm = random_permutation(n, rng);
  std::vector<std::vector<int64_t>> out(clients);
  // Client i takes [i n / clients, (i + 1) n / clients): sizes differ by at most one.
  for (int64_t i = 0; i < clients; ++i)
    out[i].assign(perm.begin() + i * n / clients, perm.begin() + (i + 1) * n / clients);
  return out;
}

std::vector<std::vector<int64_t>> by_classes(const std::vector<int64_t>& labels, int64_t clients,
                                             int64_t per_client, std::mt19937_64& rng) {
  const int64_t n = static_cast<int64_t>(labels.size());
  const int64_t shards = clients * per_client;
  KRAB_CHECK_ARG(shards <= n, "federated.classes_per_client: ", clients, " clients x ", per_client,
                 " shards each needs at least ", shards, " examples, the data has ", n);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Stable, so examples of one class stay in index order and the result is reproducible.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return labels[a] < labels[b]; });
  const std::vector<int64_t> shard_of = random_permutation(shards, rng);
  std::vector<std::vector<int64_t>> out(clients);
  for (int64_t s = 0; s < shards; ++s) {
    const int64_t shard = shard_of[s];
    auto& dst = out[s / per_client];
    dst.insert(dst.end(), order.begin() + shard * n / shards,
               order.begin() + (shard + 1) * n / shards);
  }
  return out;
}

std::vector<std::vector<int64_t>> dirichlet(const std::vector<int64_t>& labels, int64_t num_classes,
                                            int64_t clients, double alpha, uint64_t seed) {
  std::vector<std::vector<int64_t>> members(num_classes);
  for (size_t i = 0; i < labels.size(); ++i) members[labels[i]].push_back(static_cast<int64_t>(i));
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::mt19937_64 rng(derive_seed(seed, 0x64697269ULL + attempt));
    std::vector<std::vector<int64_t>> out(clients);
    std::vector<double> p(clients);
    for (int64_t c = 0; c < num_classes; ++c) {
      auto& idx = members[c];
      if (idx.empty()) continue;
      const std::vector<int64_t> perm = random_permutation(static_cast<int64_t>(idx.size()), rng);
      double total = 0;
      for (auto& x : p) total += (x = sample_gamma(alpha, rng));
      // Cut points at the rounded cumulative proportions: every example goes somewhere, and
      // rounding error never drops or duplicates one.
      double cum = 0;
      int64_t begin = 0;
      const double m = static_cast<double>(idx.size());
      for (int64_t k = 0; k < clients; ++k) {
        cum += p[k];
        const int64_t end = k + 1 == clients
                                ? static_cast<int64_t>(idx.size())
                                : std::min<int64_t>(idx.size(), std::llround(cum / total * m));
        for (int64_t j = begin; j < end; ++j) out[k].push_back(idx[perm[j]]);
        begin = std::max(begin, end);
      }
    }
    if (std::all_of(out.begin(), out.end(), [](const auto& v) { return !v.empty(); })) return out;
  }
  throw InvalidArgument(str_cat("federated.alpha: a dirichlet split with alpha ", alpha, " over ",
                                clients,
                                " clients left a client without examples in "
                                "100 draws; use fewer clients or a larger alpha"));
}

}  // namespace

double sample_gamma(double shape, std::mt19937_64& rng) {
  KRAB_CHECK_ARG(shape > 0, "sample_gamma: shape must be > 0, got ", shape);
  if (shape < 1) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a): Marsaglia-Tsang needs a >= 1.
    const double u = 1.0 - uniform01(rng);  // (0, 1]
    return sample_gamma(shape + 1, rng) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = standard_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - uniform01(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

std::vector<std::vector<int64_t>> partition(const at::Tensor& labels, int64_t num_classes,
                                            const PartitionSpec& spec) {
  KRAB_CHECK_ARG(num_classes >= 1, "partition: num_classes must be >= 1, got ", num_classes);
  const std::vector<int64_t> l = labels_of(labels, num_classes);
  const int64_t n = static_cast<int64_t>(l.size());
  KRAB_CHECK_ARG(spec.clients >= 1, "federated.clients must be >= 1, got ", spec.clients);
  KRAB_CHECK_ARG(spec.clients <= n, "federated.clients: ", spec.clients, " clients but only ", n,
                 " examples to share among them");
  std::mt19937_64 rng(derive_seed(spec.seed, 0x70617274ULL));
  std::vector<std::vector<int64_t>> out;
  if (spec.kind == "iid") {
    out = iid(n, spec.clients, rng);
  } else if (spec.kind == "classes") {
    KRAB_CHECK_ARG(spec.classes_per_client >= 1, "federated.classes_per_client must be >= 1, got ",
                   spec.classes_per_client);
    out = by_classes(l, spec.clients, spec.classes_per_client, rng);
  } else if (spec.kind == "dirichlet") {
    KRAB_CHECK_ARG(spec.alpha > 0 && std::isfinite(spec.alpha), "federated.alpha must be > 0, got ",
                   spec.alpha);
    out = dirichlet(l, num_classes, spec.clients, spec.alpha, spec.seed);
  } else {
    throw InvalidArgument(str_cat("federated.partition: unknown kind '", spec.kind,
                                  "' (known: iid, classes, dirichlet)"));
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

}  // namespace krab::data
