#include "federated/rounds.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/errors.h"
#include "federated/accountant.h"
#include "federated/privacy.h"
#include "federated/round_calls.h"

namespace krab::federated {
namespace {

std::string format_epsilon(double eps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", eps);
  return buf;
}

// A noise multiplier the accountant cannot turn into a finite epsilon (0, or so small that
// 1 / sigma^2 overflows) would make every reported epsilon meaningless: refuse it up front,
// naming the key, rather than train and print infinity (or fail in the accountant's series).
void check_dp_options(const FederatedOptions& o) {
  const double sigma = o.dp_noise_multiplier;
  KRAB_CHECK_ARG(std::isfinite(sigma) && sigma > 0,
                 "federated.dp_noise_multiplier must be > 0 with federated.dp '",
                 dp_mode_name(o.dp), "' (no noise, no privacy), got ", sigma);
  double eps = std::numeric_limits<double>::infinity();
  try {
    eps = privacy_spent(sigma, 1.0, 1, o.dp_delta).epsilon;
  } catch (const Error&) {
  }
  KRAB_CHECK_ARG(std::isfinite(eps), "federated.dp_noise_multiplier ", sigma,
                 " is too small: one round's epsilon is infinite");
}

}  // namespace

DpMode parse_dp_mode(const std::string& name) {
  if (name == "none") return DpMode::kNone;
  if (name == "central") return DpMode::kCentral;
  if (name == "local") return DpMode::kLocal;
  throw InvalidArgument(str_cat("unknown federated.dp '", name, "'; known: none, central, local"));
}

const char* dp_mode_name(DpMode mode) {
  switch (mode) {
    case DpMode::kNone:
      return "none";
    case DpMode::kCentral:
      return "central";
    case DpMode::kLocal:
      return "local";
  }
  KRAB_CHECK(false, "unknown DpMode ", static_cast<int>(mode));
  return "";
}

FederatedOptions FederatedOptions::from_config(const core::Config& c) {
  FederatedOptions o;
  o.rounds = c.get_int("federated.rounds");
  o.fraction = c.get_float("federated.fraction");
  o.min_clients = c.get_int("federated.min_clients");
  o.strategy = c.get_string("federated.strategy");
  o.strategy_options.server_lr = c.get_float("federated.server_lr");
  o.strategy_options.proximal_mu = c.get_float("federated.proximal_mu");
  o.strategy_options.eta = c.get_float("federated.eta");
  o.strategy_options.beta1 = c.get_float("federated.beta1");
  o.strategy_options.beta2 = c.get_float("federated.beta2");
  o.strategy_options.tau = c.get_float("federated.tau");
  o.aggregator = c.get_string("federated.aggregator");
  o.aggregator_options.trim_beta = c.get_float("federated.trim_beta");
  o.aggregator_options.byzantine_f = c.get_int("federated.byzantine_f");
  o.aggregator_options.krum_m = c.get_int("federated.krum_m");
  o.max_update_norm = c.get_float("federated.max_update_norm");
  o.max_client_examples = c.get_int("federated.max_client_examples");
  o.secure = c.get_bool("federated.secure_aggregation");
  o.secagg_threshold = c.get_float("federated.secagg_threshold");
  o.secagg_clip = c.get_float("federated.secagg_clip");
  o.dp = parse_dp_mode(c.get_string("federated.dp"));
  o.dp_clip = c.get_float("federated.dp_clip");
  o.dp_noise_multiplier = c.get_float("federated.dp_noise_multiplier");
  o.dp_delta = c.get_float("federated.dp_delta");
  o.eval_every = c.get_int("federated.eval_every");
  o.seed = static_cast<uint64_t>(c.get_int("train.seed"));

  KRAB_CHECK_ARG(!o.secure || o.aggregator == "mean", "federated.aggregator '", o.aggregator,
                 "' needs each client's update, which federated.secure_aggregation hides from "
                 "the server; use federated.aggregator: mean with secure aggregation");
  KRAB_CHECK_ARG(o.dp == DpMode::kNone || o.aggregator == "mean", "federated.aggregator '",
                 o.aggregator, "' cannot be combined with federated.dp '", dp_mode_name(o.dp),
                 "' (the accountant assumes a sum of clipped updates); use mean");
  KRAB_CHECK_ARG(!o.secure || o.min_clients >= 2,
                 "federated.min_clients must be >= 2 with "
                 "federated.secure_aggregation (one client's sum is its update)");
  if (o.dp != DpMode::kNone) check_dp_options(o);
  return o;
}

nlohmann::json RoundRecord::to_json() const {
  auto list = [](const std::vector<Rejection>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : v) a.push_back({{"client", r.client}, {"reason", r.reason}});
    return a;
  };
  nlohmann::json j = {{"round", round},           {"ok", ok},
                      {"cohort", cohort},         {"counted", counted},
                      {"dropped", list(dropped)}, {"rejected", list(rejected)},
                      {"bytes_down", bytes_down}, {"bytes_up", bytes_up},
                      {"mean_loss", mean_loss},   {"seconds", seconds}};
  if (!ok) j["failure"] = failure;
  if (test_accuracy >= 0) j["test_accuracy"] = test_accuracy;
  if (test_loss) j["test_loss"] = *test_loss;
  if (epsilon >= 0) j["epsilon"] = epsilon;
  if (sampling_rate >= 0) j["sampling_rate"] = sampling_rate;
  j["available"] = available;
  return j;
}

RoundLog::RoundLog(const char* label, int64_t rounds, bool show_progress, bool log_dropped)
    : log_dropped_(log_dropped) {
  if (show_progress) bar_ = std::make_unique<core::ProgressBar>(label, rounds);
}

RoundLog::~RoundLog() = default;

void RoundLog::record(const RoundRecord& rec) {
  const auto round = static_cast<long long>(rec.round);
  if (log_dropped_)
    for (const auto& r : rec.dropped)
      std::fprintf(stderr, "krab: round %lld: dropped %s: %s\n", round, r.client.c_str(),
                   r.reason.c_str());
  for (const auto& r : rec.rejected)
    std::fprintf(stderr, "krab: round %lld: rejected %s\n", round, r.reason.c_str());
  if (!rec.ok)
    std::fprintf(stderr, "krab: round %lld failed: %s (global model unchanged)\n", round,
                 rec.failure.c_str());
  if (rec.test_accuracy >= 0) score_ = "acc " + std::to_string(rec.test_accuracy).substr(0, 6);
  if (rec.test_loss) score_ = str_cat("test loss ", *rec.test_loss);
  if (rec.epsilon >= 0) epsilon_ = rec.epsilon;
  if (bar_) {
    std::string text = str_cat(
        score_, " loss ", rec.ok ? std::to_string(rec.mean_loss).substr(0, 6) : std::string("-"),
        " clients ", rec.counted.size(), "/", rec.cohort.size());
    if (epsilon_ >= 0) text += str_cat(" eps ", format_epsilon(epsilon_));
    bar_->update(rec.round, text);
  }
}

void RoundLog::finish() {
  if (!bar_) return;
  std::string text = score_;
  if (epsilon_ >= 0) text += str_cat(" eps ", format_epsilon(epsilon_));
  bar_->finish(text);
}

void add_history(nlohmann::json& report, const RoundRunner& runner) {
  nlohmann::json rounds = nlohmann::json::array();
  int64_t down = 0, up = 0;
  std::optional<std::pair<const char*, double>> last;  // the last evaluation: metric, value
  for (const auto& r : runner.history()) {
    rounds.push_back(r.to_json());
    down += r.bytes_down;
    up += r.bytes_up;
    if (r.test_accuracy >= 0) last = {"accuracy", r.test_accuracy};
    if (r.test_loss) last = {"loss", *r.test_loss};
  }
  report["rounds"] = rounds;
  report["bytes_down"] = down;
  report["bytes_up"] = up;
  if (last) {
    report["metric"] = last->first;
    report[str_cat("test_", last->first)] = last->second;
  }
  const FederatedOptions& o = runner.options();
  if (o.dp != DpMode::kNone) {
    // Spent so far, failed rounds included (each one drew a cohort and is charged).
    const double eps = runner.history().empty() ? 0.0 : runner.history().back().epsilon;
    report["epsilon"] = eps;
    report["privacy"] = {
        {"dp", dp_mode_name(o.dp)},
        {"epsilon", eps},
        {"delta", o.dp_delta},
        {"noise_multiplier", o.dp_noise_multiplier},
        {"clip", o.dp_clip},
        {"rounds_charged", runner.history().size()},
        {"accounting",
         o.dp == DpMode::kCentral
             ? "RDP of the Poisson-subsampled Gaussian mechanism, each round at the rate its "
               "cohort was drawn with (rounds[].sampling_rate), add/remove-one-client adjacency"
             : "Gaussian mechanism without amplification (the server sees each update), "
               "composed over the worst client's participations"}};
  }
}

void require_a_successful_round(const RoundRunner& runner) {
  const auto& h = runner.history();
  if (h.empty()) return;
  for (const auto& r : h)
    if (r.ok) return;
  throw Error(str_cat("every one of the ", h.size(), " round(s) failed, the last with: ",
                      h.back().failure, "; the global model was never updated"));
}

RoundRunner::RoundRunner(FederatedOptions options, at::Tensor global, bool parallel_calls,
                         Evaluator evaluate)
    : options_(std::move(options)),
      global_(std::move(global)),
      parallel_calls_(parallel_calls),
      evaluate_(std::move(evaluate)),
      strategy_(make_strategy(options_.strategy, options_.strategy_options)),
      aggregator_(make_aggregator(options_.aggregator, options_.aggregator_options)) {
  KRAB_CHECK_ARG(global_.defined() && global_.dim() == 1 && global_.scalar_type() == at::kFloat,
                 "the global model must be a 1-D float32 tensor");
}

void RoundRunner::restore(at::Tensor global, int64_t rounds_done,
                          std::vector<RoundRecord> history) {
  KRAB_CHECK_ARG(global.numel() == global_.numel(), "checkpoint: global model has ", global.numel(),
                 " parameters, the job's model has ", global_.numel());
  global_ = std::move(global);
  rounds_done_ = rounds_done;
  history_ = std::move(history);
  accountant_ = RdpAccountant();
  dp_participations_.clear();
  dp_worst_participations_ = 0;
  if (options_.dp == DpMode::kNone) return;
  // Replay the budget from the rounds themselves, so a resumed run reports what an
  // uninterrupted one would. Rounds that ran without noise cannot be made private afterwards.
  for (auto& r : history_) {
    KRAB_CHECK_ARG(r.epsilon >= 0, "checkpoint: round ", r.round,
                   " ran without differential privacy; federated.dp '", dp_mode_name(options_.dp),
                   "' cannot start in the middle of a run (start a new run directory)");
    if (options_.dp == DpMode::kCentral && r.sampling_rate < 0) r.sampling_rate = options_.fraction;
    charge_privacy(r);
  }
}

double RoundRunner::charge_privacy(const RoundRecord& rec) {
  const double sigma = options_.dp_noise_multiplier;
  if (options_.dp == DpMode::kCentral) {
    accountant_.step(sigma, rec.sampling_rate);
    return accountant_.epsilon(options_.dp_delta);
  }
  for (const auto& id : rec.cohort)
    dp_worst_participations_ = std::max(dp_worst_participations_, ++dp_participations_[id]);
  if (dp_worst_participations_ == 0) return 0;
  return privacy_spent(sigma, 1.0, dp_worst_participations_, options_.dp_delta).epsilon;
}

std::string RoundRunner::check_examples(const std::string& client, int64_t n) const {
  if (n <= 0) return str_cat("client '", client, "': reported ", n, " examples");
  if (options_.max_client_examples > 0 && n > options_.max_client_examples)
    return str_cat("client '", client, "': reported ", n,
                   " examples, above federated.max_client_examples (", options_.max_client_examples,
                   ")");
  return "";
}

double RoundRunner::expected_cohort(const RoundRecord& rec) const {
  return rec.sampling_rate * static_cast<double>(rec.available);
}

std::vector<RoundRunner::Fitted> RoundRunner::fit_cohort(const std::vector<Participant*>& cohort,
                                                         RoundRecord& rec) {
  FitInstruction ins;
  ins.round = rec.round;
  ins.global = global_;
  ins.proximal_mu = strategy_->client_proximal_mu();
  if (options_.dp != DpMode::kNone) ins.clip_norm = options_.dp_clip;
  if (options_.dp == DpMode::kLocal)
    ins.local_noise_std = options_.dp_noise_multiplier * options_.dp_clip;
  ins.secure = options_.secure;

  if (ins.secure) {
    ins.secagg_clients = cohort.size();
    ins.secagg_threshold = secagg_threshold(cohort.size());
    ins.secagg_clip = options_.secagg_clip;
  }
  std::vector<FitReply> replies(cohort.size());
  std::vector<std::string> errors(cohort.size());
  for_each_index(cohort.size(), parallel_calls_, [&](size_t i) {
    FitInstruction mine = ins;
    mine.secagg_id = i + 1;  // protocol ids: position in the cohort, from 1
    errors[i] = try_call([&] { replies[i] = cohort[i]->fit(mine); });
  });
  const int64_t model_bytes = global_.numel() * 4;
  std::vector<Fitted> fitted;
  for (size_t i = 0; i < cohort.size(); ++i) {
    if (errors[i].empty() || cohort[i]->last_request_sent()) rec.bytes_down += model_bytes;
    if (!errors[i].empty()) {
      rec.dropped.push_back({cohort[i]->id(), errors[i]});
      continue;
    }
    rec.bytes_up += replies[i].update.defined() ? replies[i].update.numel() * 4 : 0;
    rec.bytes_up += static_cast<int64_t>(replies[i].secagg.size()) + 16;
    fitted.push_back({cohort[i], std::move(replies[i]), static_cast<uint64_t>(i + 1)});
  }
  return fitted;
}

at::Tensor RoundRunner::plain_delta(std::vector<Fitted>& fitted, RoundRecord& rec) {
  const bool dp = options_.dp != DpMode::kNone;
  double bound = std::numeric_limits<double>::infinity();
  if (options_.max_update_norm > 0) bound = options_.max_update_norm;
  // Clients clip to C; allow float rounding (clip_to_norm scales by C / norm in float32), and a
  // local-DP update carries its noise on top, so only the central case is bounded by C.
  if (options_.dp == DpMode::kCentral) bound = std::min(bound, options_.dp_clip * (1 + 1e-4));

  std::vector<at::Tensor> updates;
  std::vector<double> weights;
  for (const auto& f : fitted) {
    std::string why = validate_update(f.who->id(), f.reply.update, global_.numel(), bound);
    if (why.empty()) why = check_examples(f.who->id(), f.reply.num_examples);
    if (!why.empty()) {
      rec.rejected.push_back({f.who->id(), why});
      continue;
    }
    updates.push_back(f.reply.update);
    weights.push_back(static_cast<double>(f.reply.num_examples));
    rec.counted.push_back(f.who->id());
  }
  // Central DP releases the noised sum whatever the cohort's size (see the header comment).
  if (options_.dp != DpMode::kCentral &&
      static_cast<int64_t>(updates.size()) < options_.min_clients) {
    rec.failure = str_cat(updates.size(), " usable update(s), federated.min_clients is ",
                          options_.min_clients);
    return {};
  }
  if (!dp) return aggregator_->aggregate(updates, weights);
  at::Tensor sum = updates.empty() ? torch::zeros_like(global_) : torch::stack(updates).sum(0);
  if (options_.dp == DpMode::kLocal) return sum / static_cast<double>(updates.size());
  sum = add_gaussian_noise(sum, options_.dp_noise_multiplier * options_.dp_clip);
  return sum / expected_cohort(rec);
}

size_t RoundRunner::secagg_threshold(size_t cohort) const {
  return std::max<size_t>(
      2, static_cast<size_t>(std::ceil(options_.secagg_threshold * static_cast<double>(cohort))));
}

std::vector<Participant*> RoundRunner::draw_cohort(const std::vector<Participant*>& available,
                                                   RoundRecord& rec) {
  std::vector<std::string> ids;
  for (auto* p : available) ids.push_back(p->id());
  rec.available = static_cast<int64_t>(ids.size());
  if (options_.dp == DpMode::kCentral) {
    KRAB_CHECK_ARG(rec.available >= options_.min_clients, "federated.min_clients is ",
                   options_.min_clients, " but only ", rec.available, " clients are available");
    rec.sampling_rate = dp_sampling_rate(options_.fraction, options_.min_clients, rec.available);
    rec.cohort = poisson_sample_clients(ids, rec.sampling_rate, secure_random64);
  } else {
    // Nor any other cohort (train.seed is sent to every client): a client that knows when it
    // will be sampled, and with whom, can time an attack on a round. A fresh secret seed per
    // round, unless fl-sim asks for its reproducible runs (no one there to hide them from).
    const bool seeded = options_.seeded_cohorts && options_.dp == DpMode::kNone;
    const uint64_t seed = seeded ? options_.seed : secure_random64();
    rec.cohort = sample_clients(ids, options_.fraction, options_.min_clients, rec.round, seed);
  }
  std::vector<Participant*> cohort;
  for (const auto& id : rec.cohort)
    for (auto* p : available)
      if (p->id() == id) cohort.push_back(p);
  return cohort;
}

bool RoundRunner::step(const at::Tensor& delta, RoundRecord& rec) {
  const auto saved = strategy_->state();
  ClientResult combined{"aggregate", delta, 1};
  at::Tensor next = strategy_->aggregate(global_, {combined});
  if (torch::isfinite(next).all().item<bool>()) {
    global_ = std::move(next);
    return true;
  }
  strategy_->load_state(saved);
  rec.failure = "the step would make the global model non-finite";
  return false;
}

RoundRecord RoundRunner::run_round(const std::vector<Participant*>& available) {
  const auto t0 = std::chrono::steady_clock::now();
  RoundRecord rec;
  rec.round = rounds_done_ + 1;
  const std::vector<Participant*> cohort = draw_cohort(available, rec);

  at::Tensor delta;
  std::vector<Fitted> fitted;
  if (options_.secure && cohort.size() < 2) {
    // Only a Poisson (central DP) cohort can be this small; the protocol needs two.
    rec.failure = str_cat("secure aggregation needs at least 2 sampled clients, ", cohort.size(),
                          " were sampled");
  } else {
    fitted = fit_cohort(cohort, rec);
    delta = options_.secure ? secure_delta(fitted, rec) : plain_delta(fitted, rec);
  }
  // Last line of defence: a step that would leave a non-finite model (finite but huge updates
  // overflowing, or a server optimizer's state gone bad) is not taken, and the strategy's state
  // is put back, so one bad round cannot poison every later one.
  if (delta.defined() && !torch::isfinite(delta).all().item<bool>()) {
    rec.failure = "the aggregate of the counted updates is not finite";
    delta = at::Tensor();
  }
  if (delta.defined() && step(delta, rec)) {
    rec.ok = true;
    double loss = 0, n = 0;
    for (const auto& f : fitted)
      for (const auto& id : rec.counted)
        if (id == f.who->id()) {
          loss += f.reply.mean_loss * static_cast<double>(f.reply.num_examples);
          n += static_cast<double>(f.reply.num_examples);
        }
    rec.mean_loss = n > 0 ? loss / n : 0;
  } else {
    rec.counted.clear();
  }
  if (options_.dp != DpMode::kNone) rec.epsilon = charge_privacy(rec);
  rounds_done_ = rec.round;
  if (evaluate_ && (rec.round % options_.eval_every == 0 || rec.round == options_.rounds)) {
    const Score score = evaluate_(global_);
    if (score.loss)
      rec.test_loss = score.value;
    else
      rec.test_accuracy = score.value;
  }
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  history_.push_back(rec);
  return rec;
}

}  // namespace krab::federated
