#include "federated/rounds.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <thread>

#include "core/errors.h"
#include "federated/accountant.h"
#include "federated/privacy.h"
#include "federated/secagg.h"
#include "federated/secure_client.h"

namespace krab::federated {
namespace {

// Calls fn(i) for i in [0, n): in this thread, or one thread each.
template <typename Fn>
void for_each_index(size_t n, bool parallel, Fn fn) {
  if (!parallel || n < 2) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (auto& t : threads) t.join();
}

// The reason a call failed, for the record; any exception counts as a dropout.
template <typename Fn>
std::string try_call(Fn fn) {
  try {
    fn();
    return "";
  } catch (const std::exception& e) {
    return e.what()[0] != '\0' ? e.what() : "failed";
  }
}

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
  KRAB_CHECK_ARG(std::isfinite(sigma) && sigma > 0, "federated.dp_noise_multiplier must be > 0 "
                 "with federated.dp '", o.dp, "' (no noise, no privacy), got ", sigma);
  double eps = std::numeric_limits<double>::infinity();
  try {
    eps = privacy_spent(sigma, 1.0, 1, o.dp_delta).epsilon;
  } catch (const Error&) {
  }
  KRAB_CHECK_ARG(std::isfinite(eps), "federated.dp_noise_multiplier ", sigma,
                 " is too small: one round's epsilon is infinite");
}

}  // namespace

FederatedOptions read_options(const core::Config& c) {
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
  o.dp = c.get_string("federated.dp");
  o.dp_clip = c.get_float("federated.dp_clip");
  o.dp_noise_multiplier = c.get_float("federated.dp_noise_multiplier");
  o.dp_delta = c.get_float("federated.dp_delta");
  o.eval_every = c.get_int("federated.eval_every");
  o.seed = static_cast<uint64_t>(c.get_int("train.seed"));

  KRAB_CHECK_ARG(!o.secure || o.aggregator == "mean", "federated.aggregator '", o.aggregator,
                 "' needs each client's update, which federated.secure_aggregation hides from "
                 "the server; use federated.aggregator: mean with secure aggregation");
  KRAB_CHECK_ARG(o.dp == "none" || o.aggregator == "mean", "federated.aggregator '", o.aggregator,
                 "' cannot be combined with federated.dp '", o.dp,
                 "' (the accountant assumes a sum of clipped updates); use mean");
  KRAB_CHECK_ARG(!o.secure || o.min_clients >= 2,
                 "federated.min_clients must be >= 2 with "
                 "federated.secure_aggregation (one client's sum is its update)");
  if (o.dp != "none") check_dp_options(o);
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
  if (rec.test_accuracy >= 0) accuracy_ = rec.test_accuracy;
  if (rec.epsilon >= 0) epsilon_ = rec.epsilon;
  if (bar_) {
    std::string text = str_cat(
        "acc ", accuracy_ >= 0 ? std::to_string(accuracy_).substr(0, 6) : std::string("-"),
        " loss ", rec.ok ? std::to_string(rec.mean_loss).substr(0, 6) : std::string("-"),
        " clients ", rec.counted.size(), "/", rec.cohort.size());
    if (epsilon_ >= 0) text += str_cat(" eps ", format_epsilon(epsilon_));
    bar_->update(rec.round, text);
  }
}

void RoundLog::finish() {
  if (!bar_) return;
  std::string text = str_cat("acc ", accuracy_);
  if (epsilon_ >= 0) text += str_cat(" eps ", format_epsilon(epsilon_));
  bar_->finish(text);
}

void add_history(nlohmann::json& report, const RoundRunner& runner) {
  nlohmann::json rounds = nlohmann::json::array();
  int64_t down = 0, up = 0;
  double accuracy = -1;
  for (const auto& r : runner.history()) {
    rounds.push_back(r.to_json());
    down += r.bytes_down;
    up += r.bytes_up;
    if (r.test_accuracy >= 0) accuracy = r.test_accuracy;
  }
  report["rounds"] = rounds;
  report["bytes_down"] = down;
  report["bytes_up"] = up;
  if (accuracy >= 0) report["test_accuracy"] = accuracy;
  const FederatedOptions& o = runner.options();
  if (o.dp != "none") {
    // Spent so far, failed rounds included (each one drew a cohort and is charged).
    const double eps = runner.history().empty() ? 0.0 : runner.history().back().epsilon;
    report["epsilon"] = eps;
    report["privacy"] = {
        {"dp", o.dp},
        {"epsilon", eps},
        {"delta", o.dp_delta},
        {"noise_multiplier", o.dp_noise_multiplier},
        {"clip", o.dp_clip},
        {"rounds_charged", runner.history().size()},
        {"accounting",
         o.dp == "central"
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
  if (options_.dp == "none") return;
  // Replay the budget from the rounds themselves, so a resumed run reports what an
  // uninterrupted one would. Rounds that ran without noise cannot be made private afterwards.
  for (auto& r : history_) {
    KRAB_CHECK_ARG(r.epsilon >= 0, "checkpoint: round ", r.round,
                   " ran without differential privacy; federated.dp '", options_.dp,
                   "' cannot start in the middle of a run (start a new run directory)");
    if (options_.dp == "central" && r.sampling_rate < 0) r.sampling_rate = options_.fraction;
    charge_privacy(r);
  }
}

double RoundRunner::charge_privacy(const RoundRecord& rec) {
  const double sigma = options_.dp_noise_multiplier;
  if (options_.dp == "central") {
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
                   " examples, above federated.max_client_examples (",
                   options_.max_client_examples, ")");
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
  if (options_.strategy == "fedprox") ins.proximal_mu = options_.strategy_options.proximal_mu;
  if (options_.dp != "none") ins.clip_norm = options_.dp_clip;
  if (options_.dp == "local") ins.local_noise_std = options_.dp_noise_multiplier * options_.dp_clip;
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
  const bool dp = options_.dp != "none";
  double bound = std::numeric_limits<double>::infinity();
  if (options_.max_update_norm > 0) bound = options_.max_update_norm;
  // Clients clip to C; allow float rounding (clip_to_norm scales by C / norm in float32), and a
  // local-DP update carries its noise on top, so only the central case is bounded by C.
  if (options_.dp == "central") bound = std::min(bound, options_.dp_clip * (1 + 1e-4));

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
  if (options_.dp != "central" && static_cast<int64_t>(updates.size()) < options_.min_clients) {
    rec.failure = str_cat(updates.size(), " usable update(s), federated.min_clients is ",
                          options_.min_clients);
    return {};
  }
  if (!dp) return aggregator_->aggregate(updates, weights);
  at::Tensor sum = updates.empty() ? torch::zeros_like(global_) : torch::stack(updates).sum(0);
  if (options_.dp == "local") return sum / static_cast<double>(updates.size());
  sum = add_gaussian_noise(sum, options_.dp_noise_multiplier * options_.dp_clip);
  return sum / expected_cohort(rec);
}

size_t RoundRunner::secagg_threshold(size_t cohort) const {
  return std::max<size_t>(
      2, static_cast<size_t>(std::ceil(options_.secagg_threshold * static_cast<double>(cohort))));
}

// Bonawitz et al.'s rounds 1-3 over the participants that answered fit (round 0's keys came
// with their fit replies). A participant that fails a stage is dropped from the rest; the
// protocol's own bookkeeping (secagg::Server) decides who is in the sum.
at::Tensor RoundRunner::secure_delta(std::vector<Fitted>& fitted, RoundRecord& rec) {
  FitInstruction ins;
  ins.round = rec.round;
  ins.secagg_clients = rec.cohort.size();
  ins.secagg_threshold = secagg_threshold(rec.cohort.size());
  ins.secagg_clip = options_.secagg_clip;
  secagg::Server server(secagg_config(ins, static_cast<size_t>(global_.numel())));

  // Who is still in, by protocol id (cohort position + 1).
  std::map<uint64_t, Fitted*> live;
  std::map<uint64_t, double> examples;
  // Every message must carry the id the server assigned to the connection it came on: a client
  // that claims another id could take that client's place in the sum, or (an id outside the
  // cohort) make the server index out of bounds.
  auto require_id = [](const Fitted& f, uint64_t claimed, const char* message) {
    if (claimed != f.secagg_id)
      throw CorruptData(str_cat(message, " claims client id ", claimed, "; this client's id is ",
                                f.secagg_id));
  };
  for (auto& f : fitted) {
    const std::string why = try_call([&] {
      const auto msg = secagg::AdvertiseKeys::from_bytes(f.reply.secagg);
      require_id(f, msg.client_id, "AdvertiseKeys");
      const std::string bad = check_examples(f.who->id(), f.reply.num_examples);
      if (!bad.empty()) throw InvalidArgument(bad);
      server.receive(msg);
      live[f.secagg_id] = &f;
      examples[f.secagg_id] = static_cast<double>(f.reply.num_examples);
    });
    if (!why.empty()) rec.rejected.push_back({f.who->id(), why});
  }
  auto fail = [&](const std::string& why) {
    rec.failure = "secure aggregation: " + why;
    return at::Tensor();
  };
  // One stage: call every live participant (in parallel if asked), feed the replies to the
  // server, drop the ones that fail. take_reply(reply, sender) gets the sender's Fitted.
  auto stage = [&](SecAggRequest::Stage st, auto make_request, auto take_reply) {
    std::vector<std::pair<uint64_t, Fitted*>> who(live.begin(), live.end());
    std::vector<SecAggRequest> requests(who.size());
    for (size_t i = 0; i < who.size(); ++i) {
      requests[i] = make_request(who[i].first);
      requests[i].stage = st;
    }
    std::vector<std::vector<uint8_t>> replies(who.size());
    std::vector<std::string> errors(who.size());
    for_each_index(who.size(), parallel_calls_, [&](size_t i) {
      errors[i] = try_call([&] { replies[i] = who[i].second->who->secagg(requests[i]); });
    });
    for (size_t i = 0; i < who.size(); ++i) {
      if (errors[i].empty() || who[i].second->who->last_request_sent())
        rec.bytes_down += static_cast<int64_t>(requests[i].payload.size()) + 16;
      if (errors[i].empty()) {
        rec.bytes_up += static_cast<int64_t>(replies[i].size()) + 16;
        errors[i] = try_call([&] { take_reply(replies[i], *who[i].second); });
      }
      if (!errors[i].empty()) {
        rec.dropped.push_back({who[i].second->who->id(), errors[i]});
        live.erase(who[i].first);
      }
    }
  };

  double total = 0;
  for (const auto& [id, n] : examples) total += n;
  const bool dp = options_.dp != "none";
  std::vector<uint8_t> roster;
  std::string why = try_call([&] { roster = server.roster().to_bytes(); });
  if (!why.empty()) return fail(why);
  stage(
      SecAggRequest::kShareKeys,
      [&](uint64_t id) {
        SecAggRequest r;
        r.weight = dp ? 1.0 : examples[id] / total;
        r.payload = roster;
        return r;
      },
      [&](const std::vector<uint8_t>& b, const Fitted& from) {
        const auto msg = secagg::ShareKeys::from_bytes(b);
        require_id(from, msg.client_id, "ShareKeys");
        server.receive(msg);
      });

  // shares_for() closes round 1; a client that never shared has no inbox and is not asked.
  std::map<uint64_t, std::vector<uint8_t>> inbox;
  why = try_call([&] {
    for (const auto& [id, f] : live) inbox[id] = server.shares_for(id).to_bytes();
  });
  if (!why.empty()) return fail(why);
  stage(
      SecAggRequest::kMaskedInput,
      [&](uint64_t id) {
        SecAggRequest r;
        r.payload = inbox[id];
        return r;
      },
      [&](const std::vector<uint8_t>& b, const Fitted& from) {
        const auto msg = secagg::MaskedInput::from_bytes(b);
        require_id(from, msg.client_id, "MaskedInput");
        server.receive(msg);
      });

  std::vector<uint8_t> request;
  why = try_call([&] { request = server.unmask_request().to_bytes(); });
  if (!why.empty()) return fail(why);
  stage(
      SecAggRequest::kUnmask,
      [&](uint64_t) {
        SecAggRequest r;
        r.payload = request;
        return r;
      },
      [&](const std::vector<uint8_t>& b, const Fitted& from) {
        const auto msg = secagg::UnmaskResponse::from_bytes(b);
        require_id(from, msg.client_id, "UnmaskResponse");
        server.receive(msg);
      });

  const secagg::Result* result = nullptr;
  why = try_call([&] { result = &server.result(); });
  if (!why.empty()) return fail(why);
  if (options_.dp != "central" &&
      static_cast<int64_t>(result->counted.size()) < options_.min_clients)
    return fail(str_cat(result->counted.size(), " client(s) in the sum, federated.min_clients is ",
                        options_.min_clients));
  double counted_examples = 0;
  for (uint64_t id : result->counted) {
    // Ids reach the result only through messages checked above, so each names a live entry.
    KRAB_CHECK(id >= 1 && id <= rec.cohort.size() && examples.count(id) == 1,
               "secure aggregation counted unknown client id ", id);
    counted_examples += examples[id];
    rec.counted.push_back(rec.cohort[id - 1]);
  }
  at::Tensor sum = torch::from_blob(const_cast<float*>(result->sum.data()),
                                    {static_cast<int64_t>(result->sum.size())}, torch::kFloat)
                       .clone();
  if (!dp) return sum * (total / counted_examples);  // renormalise the weights over the counted
  if (options_.dp == "local") return sum / static_cast<double>(result->counted.size());
  sum = add_gaussian_noise(sum, options_.dp_noise_multiplier * options_.dp_clip);
  return sum / expected_cohort(rec);
}

RoundRecord RoundRunner::run_round(const std::vector<Participant*>& available) {
  const auto t0 = std::chrono::steady_clock::now();
  RoundRecord rec;
  rec.round = rounds_done_ + 1;
  std::vector<std::string> ids;
  for (auto* p : available) ids.push_back(p->id());
  rec.available = static_cast<int64_t>(ids.size());
  if (options_.dp == "central") {
    KRAB_CHECK_ARG(rec.available >= options_.min_clients, "federated.min_clients is ",
                   options_.min_clients, " but only ", rec.available, " clients are available");
    rec.sampling_rate = dp_sampling_rate(options_.fraction, options_.min_clients, rec.available);
    rec.cohort = poisson_sample_clients(ids, rec.sampling_rate, secure_random64);
  } else {
    // With local DP the cohort must not be predictable either (from train.seed, which every
    // client is sent): a fresh secret seed per round.
    const uint64_t seed = options_.dp == "local" ? secure_random64() : options_.seed;
    rec.cohort = sample_clients(ids, options_.fraction, options_.min_clients, rec.round, seed);
  }
  std::vector<Participant*> cohort;
  for (const auto& id : rec.cohort)
    for (auto* p : available)
      if (p->id() == id) cohort.push_back(p);

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
  if (delta.defined()) {
    const auto saved = strategy_->state();
    ClientResult combined{"aggregate", delta, 1};
    at::Tensor next = strategy_->aggregate(global_, {combined});
    if (torch::isfinite(next).all().item<bool>()) {
      global_ = std::move(next);
    } else {
      strategy_->load_state(saved);
      rec.failure = "the step would make the global model non-finite";
      delta = at::Tensor();
    }
  }
  if (delta.defined()) {
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
  if (options_.dp != "none") rec.epsilon = charge_privacy(rec);
  rounds_done_ = rec.round;
  if (evaluate_ && (rec.round % options_.eval_every == 0 || rec.round == options_.rounds))
    rec.test_accuracy = evaluate_(global_);
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  history_.push_back(rec);
  return rec;
}

}  // namespace krab::federated
