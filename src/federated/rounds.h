// The server's round loop: one federated round from cohort to new global model.
//
// The loop is transport-agnostic. It talks to clients through Participant, the server's
// handle on one client: in `krab fl-sim` a Participant trains in the calling thread on a data
// shard held in the same process; behind `krab fl-server` it forwards to a remote client and
// waits for the reply. Either way a round is:
//
//   1. cohort   sample_clients(available, federated.fraction, federated.min_clients, round,
//               seed) (strategy.h) with a fresh seed from the OS's secure generator each round,
//               so no one (every client is sent train.seed) can predict a cohort; fl-sim alone
//               may ask for seed = train.seed (FederatedOptions::seeded_cohorts), for runs that
//               repeat exactly. With central DP instead Poisson sampling from the secure
//               generator (each client independently with probability q, see below);
//   2. fit      each cohort member gets a FitInstruction (the global parameters and the
//               round's privacy and FedProx settings) and replies with its update and example
//               count. A member that throws (PeerLost, Timeout, or any krab::Error: it dropped,
//               missed federated.round_deadline_s, or failed) is left out: it is *dropped*, with
//               the reason in the round's record;
//   3. checks   plain aggregation: every update goes through validate_update() (robust.h:
//               shape, NaN/Inf, federated.max_update_norm, and with DP the clipping bound); a
//               failing update is *rejected* and logged with the client id;
//   4. combine  plain: the aggregator (federated.aggregator) turns the accepted updates into one
//               delta (mean weighted by examples, or median / trimmed mean / krum / multi-krum);
//               secure (federated.secure_aggregation): the clients' weighted updates are summed
//               under pairwise masks (secagg.h) and the server learns only the sum of the
//               clients that survived the masking step. Central DP adds N(0, (sigma C)^2) to the
//               sum before it is divided by the cohort size;
//   5. step     the strategy (fedavg, fedprox, fedadam, fedyogi) applies the delta to the global
//               model (Strategy::aggregate with the delta as its single result);
//   6. record   a RoundRecord: who was sampled, counted, dropped and rejected (with reasons),
//               bytes each way, the mean client loss, the test metric (accuracy or mean test
//               loss, train.metric) when evaluated, and with DP the epsilon spent so far.
// When fewer than federated.min_clients updates remain after steps 2-4, or the step would make
// the global model non-finite (updates that are finite but huge enough to overflow), the round
// fails: the global model and the strategy's state are left exactly as they were and the record
// says why (never a silent partial aggregate). Finite but merely large updates are stopped only
// by federated.max_update_norm or a robust aggregator.
//
// Differential privacy (federated.dp), client level, add/remove-one-client adjacency:
//   `central` — DP-FedAvg (McMahan et al. 2018) exactly as its accountant assumes. Each available
//     client joins the cohort independently with probability q = dp_sampling_rate(fraction,
//     min_clients, available) (Poisson sampling, drawn from libsodium's CSPRNG so no one can
//     predict a cohort); clients clip to federated.dp_clip = C; the server adds N(0, (sigma C)^2)
//     to the sum of the clipped updates and divides by the EXPECTED cohort size q * available,
//     a public number (dividing by the actual count would publish it). A small or even empty
//     cohort is therefore not a failure: the round releases the noised sum as the mechanism
//     says. Every round is charged to the RDP accountant (accountant.h) at its own q, failed
//     rounds included (conservative), so the epsilon each record carries is the sampled
//     Gaussian mechanism's, composed over the rounds so far.
//   `local` — each client adds N(0, (sigma C)^2) to its own clipped update before sending it.
//     The server sees who sent what, so there is no amplification by sampling: every round a
//     client is asked for an update is a full Gaussian mechanism for that client, and the
//     epsilon reported is the worst client's (q = 1 over its participations).
// In both cases aggregation is unweighted (a weight is data-dependent and would leak). With
// secure aggregation and central DP a round whose Poisson cohort has fewer than 2 clients
// cannot run the protocol and fails; it is still charged, and the failure reveals only that
// fewer than 2 were sampled (not covered by the Gaussian bound; docs/privacy.md says so).
//
// Thread safety: a RoundRunner is driven by one thread. With `parallel_calls`, a stage calls
// its participants from one thread each, so Participant implementations must then tolerate
// concurrent calls on *different* participants (never on the same one).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/progress.h"
#include "federated/accountant.h"
#include "federated/robust.h"
#include "federated/strategy.h"

namespace krab::federated {

// What a client is asked to do in a round.
struct FitInstruction {
  int64_t round = 0;
  at::Tensor global;           // 1-D float32; shared, read-only
  double proximal_mu = 0;      // FedProx
  double clip_norm = 0;        // > 0: clip the update (DP)
  double local_noise_std = 0;  // > 0: local DP noise
  bool secure = false;         // true: keep the update, answer with secagg keys instead
  // Secure rounds: this client's protocol id (>= 1, unique in the round), the Shamir threshold,
  // the cohort size and the clamp range the fixed-point encoding is sized for (secagg.h).
  uint64_t secagg_id = 0;
  size_t secagg_threshold = 0;
  size_t secagg_clients = 0;
  double secagg_clip = 0;
};

struct FitReply {
  at::Tensor update;  // plain rounds: 1-D float32 (empty in secure rounds)
  int64_t num_examples = 0;
  double mean_loss = 0;
  std::vector<uint8_t> secagg;  // secure rounds: the client's AdvertiseKeys message
};

// One step of secure aggregation after fit (secagg.h's rounds 1-3).
struct SecAggRequest {
  enum Stage { kShareKeys = 1, kMaskedInput = 2, kUnmask = 3 };
  Stage stage = kShareKeys;
  double weight = 0;             // kShareKeys: the factor the client scales its update by
  std::vector<uint8_t> payload;  // the server's message for this stage
};

class Participant {
 public:
  virtual ~Participant() = default;
  virtual const std::string& id() const = 0;
  // Throws a krab::Error (PeerLost, Timeout, ...) when the client cannot answer.
  virtual FitReply fit(const FitInstruction& instruction) = 0;
  virtual std::vector<uint8_t> secagg(const SecAggRequest& request) = 0;
  // Whether the last call's request reached the client (a remote client that had stopped
  // polling never received it); a round's bytes_down counts only what was sent.
  virtual bool last_request_sent() const { return true; }
};

// federated.dp: where the noise of differential privacy is added (see the header comment).
enum class DpMode { kNone, kCentral, kLocal };

// "none" | "central" | "local" (the config's spelling, also what reports print). parse_dp_mode
// throws InvalidArgument listing the known names for anything else.
DpMode parse_dp_mode(const std::string& name);
const char* dp_mode_name(DpMode mode);

// The federated.* keys, read once at the edge (from_config); past it nothing compares option
// strings. `strategy` and `aggregator` stay names: they pick an implementation from a factory
// (make_strategy, make_aggregator), which refuses unknown names itself.
struct FederatedOptions {
  int64_t rounds = 20;
  double fraction = 0.1;
  int64_t min_clients = 2;
  std::string strategy = "fedavg";
  StrategyOptions strategy_options;
  std::string aggregator = "mean";
  AggregatorOptions aggregator_options;
  double max_update_norm = 0;             // 0 = no bound
  int64_t max_client_examples = 1000000;  // 0 = no bound on a client's self-reported count
  bool secure = false;
  double secagg_threshold = 0.66;  // of the cohort size
  double secagg_clip = 4.0;        // per-coordinate range of a weighted update
  DpMode dp = DpMode::kNone;
  double dp_clip = 1.0, dp_noise_multiplier = 1.0, dp_delta = 1e-5;
  int64_t eval_every = 1;
  uint64_t seed = 0;
  // Not a config key: fl-sim sets it, so that without DP its cohorts follow `seed` and a run
  // repeats exactly (it has no remote clients to hide the cohorts from). fl-server never does.
  bool seeded_cohorts = false;

  // Reads and cross-checks the keys; InvalidArgument naming the key for combinations that
  // cannot work (a robust aggregator with secure aggregation — it needs individual updates — or
  // with DP; min_clients below 2 with secure aggregation; a noise multiplier with no finite
  // epsilon).
  static FederatedOptions from_config(const core::Config& config);
};

struct Rejection {
  std::string client;
  std::string reason;
};

struct RoundRecord {
  int64_t round = 0;
  bool ok = false;
  std::string failure;  // why, when !ok
  std::vector<std::string> cohort, counted;
  std::vector<Rejection> dropped, rejected;
  int64_t bytes_down = 0, bytes_up = 0;
  double mean_loss = 0;  // example-weighted over counted clients
  double seconds = 0;
  double test_accuracy = -1;        // -1: not evaluated this round (or train.metric loss)
  std::optional<double> test_loss;  // train.metric loss: the mean test loss, when evaluated
  double epsilon = -1;              // -1: no DP; else spent so far (failed rounds are charged too)
  double sampling_rate = -1;        // central DP: the q this round's cohort was drawn with
  int64_t available = 0;            // clients the cohort was drawn from
  nlohmann::json to_json() const;
};

// What a run shows as rounds finish: one stderr line per dropped (if `log_dropped`) and
// rejected client and for a failed round, and a progress bar with the latest test metric.
class RoundLog {
 public:
  RoundLog(const char* label, int64_t rounds, bool show_progress, bool log_dropped);
  ~RoundLog();
  void record(const RoundRecord& record);
  void finish();

 private:
  std::unique_ptr<core::ProgressBar> bar_;
  bool log_dropped_;
  std::string score_ = "-";  // the latest evaluation, as the bar shows it
  double epsilon_ = -1;
};

class RoundRunner;

// The report's part every federated run shares: "rounds" (the records), "bytes_down" and
// "bytes_up" (the runner's totals, payload sizes), "metric" and "test_accuracy" or "test_loss"
// (the last evaluation, by train.metric) and,
// with DP, "epsilon" (spent so far).
void add_history(nlohmann::json& report, const RoundRunner& runner);

// Throws krab::Error (exit 1) when rounds ran and every one of them failed, naming the last
// failure: the model is still the initial one, and such a run must not exit 0. Call it after
// the report is written, so the record of what went wrong is kept.
void require_a_successful_round(const RoundRunner& runner);

class RoundRunner {
 public:
  // train.metric of a flat parameter vector on the server's held-out data.
  struct Score {
    bool loss = false;  // value is the mean test loss; else the test accuracy
    double value = 0;
  };
  using Evaluator = std::function<Score(const at::Tensor& global)>;

  // `global`: the initial flat parameters. `parallel_calls`: see the header comment.
  // `evaluate` (may be empty: no held-out data) runs every federated.eval_every rounds and
  // after the last one.
  RoundRunner(FederatedOptions options, at::Tensor global, bool parallel_calls,
              Evaluator evaluate = {});

  // Runs round `rounds_done() + 1` over `available` (the clients that can be sampled) and
  // returns its record (also kept in history()). Never throws for a client's failure; throws
  // InvalidArgument when fewer clients are available than federated.min_clients.
  RoundRecord run_round(const std::vector<Participant*>& available);

  const at::Tensor& global() const { return global_; }
  int64_t rounds_done() const { return rounds_done_; }
  const std::vector<RoundRecord>& history() const { return history_; }
  Strategy& strategy() { return *strategy_; }
  const FederatedOptions& options() const { return options_; }

  // For resuming after a crash: the state a checkpoint holds.
  void restore(at::Tensor global, int64_t rounds_done, std::vector<RoundRecord> history);

 private:
  struct Fitted {
    Participant* who;
    FitReply reply;
    uint64_t secagg_id = 0;  // the protocol id the server assigned this connection
  };
  class SecureRound;  // secure_delta's protocol run (secure_round.cpp)

  // Step 1: fills rec.available, rec.cohort (and with central DP rec.sampling_rate) and returns
  // the cohort's members.
  std::vector<Participant*> draw_cohort(const std::vector<Participant*>& available,
                                        RoundRecord& rec);
  std::vector<Fitted> fit_cohort(const std::vector<Participant*>& cohort, RoundRecord& rec);
  // Returns the delta, or an undefined tensor after recording why the round failed.
  at::Tensor plain_delta(std::vector<Fitted>& fitted, RoundRecord& rec);
  at::Tensor secure_delta(std::vector<Fitted>& fitted, RoundRecord& rec);
  // Step 5: applies `delta` to the global model. Returns false, with the strategy's state put
  // back and rec.failure set, when the step would leave a non-finite model.
  bool step(const at::Tensor& delta, RoundRecord& rec);
  size_t secagg_threshold(size_t cohort) const;
  // Charges `rec`'s round to the privacy budget and returns the epsilon spent so far.
  double charge_privacy(const RoundRecord& rec);
  // Why a reported example count is refused ("" = fine): <= 0, or above the bound.
  std::string check_examples(const std::string& client, int64_t n) const;
  // Central DP: the fixed denominator q * available (see the header comment).
  double expected_cohort(const RoundRecord& rec) const;

  FederatedOptions options_;
  at::Tensor global_;
  bool parallel_calls_;
  Evaluator evaluate_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<Aggregator> aggregator_;
  int64_t rounds_done_ = 0;
  RdpAccountant accountant_;                          // central DP
  std::map<std::string, int64_t> dp_participations_;  // local DP: rounds each client was asked
  int64_t dp_worst_participations_ = 0;
  std::vector<RoundRecord> history_;
};

}  // namespace krab::federated
