// Strategies: the weighted average every strategy starts from, the adaptive server optimizers,
// client sampling and the FedProx term.
#include "federated/strategy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/errors.h"
#include "core/rng.h"

namespace krab::federated {
namespace {

void check_global(const at::Tensor& global) {
  KRAB_CHECK_ARG(global.defined() && global.dim() == 1 && global.scalar_type() == at::kFloat,
                 "global parameters must be a 1-D float32 tensor, got ",
                 global.defined() ? global.toString() : "an undefined tensor",
                 global.defined() ? str_cat(" of shape ", global.sizes()) : "");
}

// splitmix64 (core/rng.h): its output is the same on every platform (the <random>
// distributions are not specified bit-for-bit, so two builds could pick different cohorts).
using core::SplitMix64;

}  // namespace

at::Tensor weighted_average(const std::vector<ClientResult>& results, int64_t numel) {
  KRAB_CHECK_ARG(!results.empty(), "aggregate: no client results to aggregate");
  int64_t total = 0;
  for (const auto& r : results) {
    const at::Tensor& u = r.update;
    KRAB_CHECK_ARG(u.defined() && u.dim() == 1 && u.scalar_type() == at::kFloat, "client '",
                   r.client_id, "': update must be a 1-D float32 tensor");
    KRAB_CHECK_ARG(u.numel() == numel, "client '", r.client_id, "': update has ", u.numel(),
                   " elements, the global model has ", numel);
    KRAB_CHECK_ARG(u.device() == results.front().update.device(), "client '", r.client_id,
                   "': update is on ", u.device(), ", the first on ",
                   results.front().update.device());
    KRAB_CHECK_ARG(r.num_examples >= 0, "client '", r.client_id, "': num_examples is ",
                   r.num_examples, ", must be >= 0");
    total += r.num_examples;
  }
  KRAB_CHECK_ARG(total > 0, "aggregate: the ", results.size(),
                 " client results report 0 examples in total; cannot weight them");
  at::Tensor avg = at::zeros({numel}, results.front().update.options());
  // Normalised weights in double, then one fused multiply-add per client: the float32 sum of
  // w_k u_k stays in the updates' range (no n_k-scaled intermediate).
  for (const auto& r : results) {
    if (r.num_examples == 0) continue;
    avg.add_(r.update, static_cast<double>(r.num_examples) / static_cast<double>(total));
  }
  return avg;
}

FedAvg::FedAvg(double server_lr) : server_lr_(server_lr) {
  KRAB_CHECK_ARG(std::isfinite(server_lr) && server_lr > 0, "fedavg: server_lr must be > 0, got ",
                 server_lr);
}

at::Tensor FedAvg::aggregate(const at::Tensor& global, const std::vector<ClientResult>& results) {
  check_global(global);
  at::Tensor delta = weighted_average(results, global.numel());
  return global.add(delta.to(global.device()), server_lr_);
}

FedProx::FedProx(double mu, double server_lr) : FedAvg(server_lr), mu_(mu) {
  KRAB_CHECK_ARG(std::isfinite(mu) && mu >= 0, "fedprox: proximal_mu must be >= 0, got ", mu);
}

FedAdaptive::FedAdaptive(Variant variant, const StrategyOptions& options)
    : variant_(variant), options_(options) {
  const std::string n = name();
  KRAB_CHECK_ARG(std::isfinite(options.eta) && options.eta > 0, n, ": eta must be > 0, got ",
                 options.eta);
  KRAB_CHECK_ARG(options.beta1 >= 0 && options.beta1 < 1, n, ": beta1 must be in [0, 1), got ",
                 options.beta1);
  KRAB_CHECK_ARG(options.beta2 >= 0 && options.beta2 < 1, n, ": beta2 must be in [0, 1), got ",
                 options.beta2);
  KRAB_CHECK_ARG(std::isfinite(options.tau) && options.tau > 0, n, ": tau must be > 0, got ",
                 options.tau);
  if (options.initial_v) {
    KRAB_CHECK_ARG(std::isfinite(*options.initial_v) && *options.initial_v >= 0, n,
                   ": initial_v must be >= 0, got ", *options.initial_v);
  }
}

std::string FedAdaptive::name() const { return variant_ == Variant::kAdam ? "fedadam" : "fedyogi"; }

at::Tensor FedAdaptive::aggregate(const at::Tensor& global,
                                  const std::vector<ClientResult>& results) {
  check_global(global);
  if (m_.defined()) {
    KRAB_CHECK_ARG(m_.numel() == global.numel(), name(), ": the global model has ", global.numel(),
                   " elements but the optimizer state has ", m_.numel(),
                   " (state from a different model?)");
  }
  // Everything that can throw happens before the state is touched.
  const at::Tensor delta = weighted_average(results, global.numel()).to(global.device());
  const double b1 = options_.beta1, b2 = options_.beta2;
  at::Tensor m = m_.defined() ? m_.to(global.device()) : at::zeros_like(global);
  at::Tensor v =
      v_.defined()
          ? v_.to(global.device())
          : at::full_like(global, options_.initial_v.value_or(options_.tau * options_.tau));
  m = m * b1 + delta * (1 - b1);
  const at::Tensor d2 = delta * delta;
  if (variant_ == Variant::kAdam) {
    v = v * b2 + d2 * (1 - b2);
  } else {
    // Yogi steps v towards delta^2 by (1 - b2) delta^2, whatever the gap; Adam's step is
    // (1 - b2)(delta^2 - v), which lets one large update inflate v (and stall learning) at once.
    v = v - d2 * (1 - b2) * at::sign(v - d2);
  }
  m_ = m;
  v_ = v;
  ++rounds_;
  return global + options_.eta * m / (at::sqrt(v) + options_.tau);
}

std::map<std::string, at::Tensor> FedAdaptive::state() const {
  std::map<std::string, at::Tensor> s;
  s["rounds"] = at::tensor(rounds_, at::kLong);
  if (m_.defined()) {
    s["m"] = m_.clone();
    s["v"] = v_.clone();
  }
  return s;
}

void FedAdaptive::load_state(const std::map<std::string, at::Tensor>& state) {
  const std::string n = name();
  auto it = state.find("rounds");
  KRAB_CHECK_ARG(it != state.end() && it->second.defined() && it->second.numel() == 1, n,
                 ": state has no scalar 'rounds'");
  const int64_t rounds = it->second.item<int64_t>();
  KRAB_CHECK_ARG(rounds >= 0, n, ": state 'rounds' is ", rounds);
  const bool has_m = state.count("m") > 0, has_v = state.count("v") > 0;
  KRAB_CHECK_ARG(has_m == has_v, n, ": state has '", has_m ? "m" : "v", "' without '",
                 has_m ? "v" : "m", "'");
  at::Tensor m, v;
  if (has_m) {
    m = state.at("m");
    v = state.at("v");
    for (const auto* t : {&m, &v}) {
      KRAB_CHECK_ARG(t->defined() && t->dim() == 1 && t->scalar_type() == at::kFloat, n,
                     ": state 'm' and 'v' must be 1-D float32 tensors");
    }
    KRAB_CHECK_ARG(m.numel() == v.numel(), n, ": state 'm' has ", m.numel(), " elements, 'v' ",
                   v.numel());
    m = m.clone();
    v = v.clone();
  }
  m_ = m;
  v_ = v;
  rounds_ = rounds;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const StrategyOptions& options) {
  if (name == "fedavg") return std::make_unique<FedAvg>(options.server_lr);
  if (name == "fedprox") return std::make_unique<FedProx>(options.proximal_mu, options.server_lr);
  if (name == "fedadam") {
    return std::make_unique<FedAdaptive>(FedAdaptive::Variant::kAdam, options);
  }
  if (name == "fedyogi") {
    return std::make_unique<FedAdaptive>(FedAdaptive::Variant::kYogi, options);
  }
  throw InvalidArgument(
      str_cat("unknown federated strategy '", name, "'; known: fedavg, fedprox, fedadam, fedyogi"));
}

std::vector<std::string> sample_clients(const std::vector<std::string>& available, double fraction,
                                        int64_t min_clients, int64_t round, uint64_t seed) {
  const auto n = static_cast<int64_t>(available.size());
  KRAB_CHECK_ARG(fraction > 0 && fraction <= 1, "sample_clients: fraction must be in (0, 1], got ",
                 fraction);
  KRAB_CHECK_ARG(min_clients >= 1, "sample_clients: min_clients must be >= 1, got ", min_clients);
  KRAB_CHECK_ARG(min_clients <= n, "sample_clients: min_clients is ", min_clients, " but only ", n,
                 " clients are available");
  // Sorting first makes the cohort a function of the set of ids, not of the order in which
  // they connected.
  std::vector<std::string> ids = available;
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  KRAB_CHECK_ARG(dup == ids.end(), "sample_clients: client id '", *dup,
                 "' is listed more than once");
  // The epsilon keeps 0.29 * 100 (28.999999999999996 in double) from becoming 28.
  int64_t k = static_cast<int64_t>(std::floor(fraction * static_cast<double>(n) + 1e-9));
  k = std::min(n, std::max(k, min_clients));
  // One stream per (seed, round): the round is mixed in through a splitmix step of its own so
  // that seed s round r+1 and seed s+1 round r do not share a stream.
  SplitMix64 mix(seed);
  SplitMix64 rng(mix.next() ^ SplitMix64(static_cast<uint64_t>(round)).next());
  // Partial Fisher-Yates: the first k slots end up a uniform k-subset.
  for (int64_t i = 0; i < k; ++i) {
    const auto j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - i)));
    std::swap(ids[i], ids[j]);
  }
  ids.resize(k);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<std::string> poisson_sample_clients(const std::vector<std::string>& available,
                                                double rate,
                                                const std::function<uint64_t()>& random64) {
  KRAB_CHECK_ARG(rate > 0 && rate <= 1, "poisson_sample_clients: rate must be in (0, 1], got ",
                 rate);
  std::vector<std::string> ids = available;
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  KRAB_CHECK_ARG(dup == ids.end(), "poisson_sample_clients: client id '", *dup,
                 "' is listed more than once");
  std::vector<std::string> cohort;
  for (auto& id : ids) {
    // 53 random bits: u is uniform on a grid of [0, 1), so P(u < rate) = rate to within 2^-53.
    const double u = static_cast<double>(random64() >> 11) * 0x1.0p-53;
    if (u < rate) cohort.push_back(std::move(id));
  }
  return cohort;
}

double dp_sampling_rate(double fraction, int64_t min_clients, int64_t available) {
  KRAB_CHECK_ARG(available >= 1, "dp_sampling_rate: no clients are available");
  const double floor_rate = static_cast<double>(min_clients) / static_cast<double>(available);
  return std::min(1.0, std::max(fraction, floor_rate));
}

namespace {

void check_prox_args(const std::vector<at::Tensor>& params,
                     const std::vector<at::Tensor>& global_params, double mu) {
  KRAB_CHECK_ARG(std::isfinite(mu) && mu >= 0, "fedprox: mu must be >= 0, got ", mu);
  KRAB_CHECK_ARG(params.size() == global_params.size(), "fedprox: ", params.size(),
                 " parameters but ", global_params.size(), " global parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    KRAB_CHECK_ARG(params[i].sizes() == global_params[i].sizes(), "fedprox: parameter ", i,
                   " has shape ", params[i].sizes(), ", its global copy ",
                   global_params[i].sizes());
  }
}

}  // namespace

at::Tensor fedprox_penalty(const std::vector<at::Tensor>& params,
                           const std::vector<at::Tensor>& global_params, double mu) {
  check_prox_args(params, global_params, mu);
  if (params.empty()) return at::zeros({});
  at::Tensor sq = at::zeros(
      {}, at::TensorOptions().dtype(params.front().scalar_type()).device(params.front().device()));
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor g = global_params[i].detach().to(params[i].device(), params[i].scalar_type());
    sq = sq + (params[i] - g).pow(2).sum();
  }
  return sq * (mu / 2);
}

void fedprox_add_grad(const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& global_params, double mu) {
  check_prox_args(params, global_params, mu);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    at::Tensor diff = p.detach() - global_params[i].detach().to(p.device(), p.scalar_type());
    at::Tensor& g = p.mutable_grad();
    if (g.defined()) {
      g.add_(diff, mu);
    } else {
      g = diff.mul_(mu);
    }
  }
}

}  // namespace krab::federated
