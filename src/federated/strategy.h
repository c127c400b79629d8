// Server-side federated strategies: how a round's client updates become the next global model.
//
// A round, as the server runs it (Flower's configure_fit / aggregate_fit split):
//   1. sample_clients() picks this round's cohort from the clients that are connected;
//   2. each picked client trains from the current global parameters and reports a ClientResult:
//      its parameters minus the global ones (the update) and how many examples it trained on;
//   3. the server drops results that fail validation (robust.h: validate_update) and calls
//      Strategy::aggregate(global, results), which returns the new global parameters.
// A model's parameters travel as ONE flat float32 tensor (every parameter flattened and
// concatenated in the model's order); all the math here is on such tensors, on any device, and
// never talks to the network or the file system.
//
// Strategies (make_strategy names):
//   fedavg   McMahan et al. 2017. x += server_lr * delta, where delta is the average of the
//            updates weighted by num_examples.
//   fedprox  Li et al. 2020. The same server step as fedavg; the difference is on the client,
//            which adds a proximal term to its loss (fedprox_penalty / fedprox_add_grad below)
//            with the strategy's mu (FedProx::mu(), sent to clients with the round's config).
//   fedadam  Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2, Adam variant:
//              m = b1 m + (1 - b1) delta
//              v = b2 v + (1 - b2) delta^2
//              x += eta m / (sqrt(v) + tau)
//   fedyogi  the same with Yogi's second moment: v = v - (1 - b2) delta^2 sign(v - delta^2).
// As in the paper there is no bias correction, m starts at 0 and v at tau^2 ("v_{-1} >= tau^2";
// AdaptiveOptions::initial_v overrides it, e.g. 0 as Flower does). The state (m, v, rounds) lives
// in the strategy and persists across rounds; state()/load_state() move it to and from a
// checkpoint as plain tensors.
//
// Errors: krab::InvalidArgument for the caller's mistakes, with a message that names the
// argument or the client at fault: an empty result list, updates whose size differs from the
// global model, a negative example count, zero examples in total, an unknown strategy name.
// Nothing is modified when aggregate() throws. Thread safety: a Strategy is used by one server
// loop; concurrent calls on the same object need external locking; distinct objects are
// independent.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace krab::federated {

// One client's contribution to a round.
struct ClientResult {
  std::string client_id;
  at::Tensor update;  // 1-D float32: client parameters minus the global ones it started from
  int64_t num_examples = 0;
};

// The weighted average sum_k n_k u_k / sum_k n_k of the updates (n_k = num_examples), as a new
// 1-D float32 tensor of `numel` elements on the updates' device. Every update must be 1-D
// float32 with `numel` elements; n_k >= 0 with a positive sum.
at::Tensor weighted_average(const std::vector<ClientResult>& results, int64_t numel);

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;

  // `global`: the current flat parameters (1-D float32). Returns the new global parameters as a
  // new tensor; `global` itself is not modified. `results` must be non-empty and agree with
  // `global` in size.
  virtual at::Tensor aggregate(const at::Tensor& global,
                               const std::vector<ClientResult>& results) = 0;

  // Server-optimizer state for a checkpoint, by name (empty for stateless strategies). The
  // tensors are copies; load_state() accepts exactly what state() returned (possibly after a
  // round trip through torch::save/load) and throws InvalidArgument on missing keys.
  virtual std::map<std::string, at::Tensor> state() const { return {}; }
  virtual void load_state(const std::map<std::string, at::Tensor>& state) {}

  // The mu clients use in their proximal term (fedprox_penalty below), sent with each round's
  // fit instruction; 0 (no term) for every strategy but FedProx.
  virtual double client_proximal_mu() const { return 0; }
};

struct StrategyOptions {
  // fedavg, fedprox: the server step size applied to the averaged update (1 = plain FedAvg).
  double server_lr = 1.0;
  // fedprox: the proximal coefficient mu (>= 0) clients use.
  double proximal_mu = 0.01;
  // fedadam, fedyogi. eta is the server learning rate; the paper tunes it per task over
  // 10^-3 ... 10^1 (0.01 is a middle-of-the-grid default, not a universal one). b1, b2 and tau
  // are the paper's defaults.
  double eta = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double tau = 1e-3;
  std::optional<double> initial_v;  // unset: tau^2, as in the paper
};

class FedAvg : public Strategy {
 public:
  explicit FedAvg(double server_lr = 1.0);
  std::string name() const override { return "fedavg"; }
  at::Tensor aggregate(const at::Tensor& global, const std::vector<ClientResult>& results) override;

 private:
  double server_lr_;
};

// FedAvg on the server; mu() is what clients pass to fedprox_penalty / fedprox_add_grad.
class FedProx : public FedAvg {
 public:
  FedProx(double mu, double server_lr = 1.0);
  std::string name() const override { return "fedprox"; }
  double mu() const { return mu_; }
  double client_proximal_mu() const override { return mu_; }

 private:
  double mu_;
};

// FedAdam and FedYogi share everything except the second-moment update.
class FedAdaptive : public Strategy {
 public:
  enum class Variant { kAdam, kYogi };
  FedAdaptive(Variant variant, const StrategyOptions& options);

  std::string name() const override;
  at::Tensor aggregate(const at::Tensor& global, const std::vector<ClientResult>& results) override;

  // Keys "m", "v" (float32, the model's size; undefined before the first round: state() then
  // returns only "rounds") and "rounds" (int64 scalar: rounds aggregated so far).
  std::map<std::string, at::Tensor> state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state) override;

  int64_t rounds() const { return rounds_; }

 private:
  Variant variant_;
  StrategyOptions options_;
  at::Tensor m_, v_;  // undefined until the first aggregate()
  int64_t rounds_ = 0;
};

// `name`: fedavg | fedprox | fedadam | fedyogi. Options a strategy does not use are ignored;
// those it uses are range-checked (server_lr, eta, tau > 0; 0 <= beta1, beta2 < 1; mu >= 0).
std::unique_ptr<Strategy> make_strategy(const std::string& name,
                                        const StrategyOptions& options = {});

// Chooses this round's cohort: max(floor(fraction * n), min_clients) of the n ids in
// `available`, uniformly without replacement, returned in ascending id order. Deterministic in
// (the set of ids, fraction, min_clients, round, seed): the order of `available` does not
// matter, and each round draws a fresh, independent-looking cohort. Requires 0 < fraction <= 1,
// 1 <= min_clients <= n, ids unique; min_clients > n (too few clients connected) throws
// InvalidArgument naming min_clients and n.
std::vector<std::string> sample_clients(const std::vector<std::string>& available, double fraction,
                                        int64_t min_clients, int64_t round, uint64_t seed);

// Poisson sampling, the sampling the differential-privacy accountant (accountant.h) assumes:
// each id in `available` joins the cohort independently with probability `rate` (0 < rate <= 1),
// so the cohort's size is Binomial(n, rate) and may be 0. `random64` supplies uniform 64-bit
// words; with DP the caller passes a cryptographically secure source so nobody can predict a
// cohort (the amplification by subsampling assumes that). Returned in ascending id order; ids
// must be unique.
std::vector<std::string> poisson_sample_clients(const std::vector<std::string>& available,
                                                double rate,
                                                const std::function<uint64_t()>& random64);

// The sampling rate a DP round uses: `fraction`, raised so that the expected cohort
// (rate * available) is at least `min_clients`, at most 1. This is the q the accountant charges.
double dp_sampling_rate(double fraction, int64_t min_clients, int64_t available);

// FedProx on the client. The local objective is loss(w) + mu/2 ||w - w_global||^2, where
// w_global are the parameters the round started from. Either form works:
//
//   // a) through autograd
//   std::vector<at::Tensor> global;                         // taken once, at round start
//   for (const auto& p : model->parameters()) global.push_back(p.detach().clone());
//   for (batch : data) {
//     opt.zero_grad();
//     auto loss = criterion(model->forward(x), y) + fedprox_penalty(model->parameters(),
//                                                                   global, mu);
//     loss.backward();
//     opt.step();
//   }
//   // b) on the gradients, after backward() and before the optimizer step (no extra graph):
//     loss.backward();
//     fedprox_add_grad(model->parameters(), global, mu);
//     opt.step();
//
// `params` and `global_params` are matched by position and must agree in shape. The penalty is
// a 0-dim tensor of params' dtype and device that autograd differentiates to mu (w - w_global).
// fedprox_add_grad adds mu (w - w_global) to each parameter's .grad() in place (creating the
// gradient where it is undefined), outside autograd. mu >= 0; mu = 0 is plain FedAvg.
at::Tensor fedprox_penalty(const std::vector<at::Tensor>& params,
                           const std::vector<at::Tensor>& global_params, double mu);
void fedprox_add_grad(const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& global_params, double mu);

}  // namespace krab::federated
