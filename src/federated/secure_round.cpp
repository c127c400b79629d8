// The server's side of a secure round (RoundRunner::secure_delta, rounds.h): Bonawitz et al.'s
// rounds 1-3 over the participants that answered fit, whose round-0 keys (AdvertiseKeys) came
// with their fit replies. A participant that fails a stage, or answers round 3 with bad shares,
// is dropped from the rest; the
// protocol's own bookkeeping (secagg::Server) decides who is in the sum. This file carries the
// messages, records the traffic and turns the protocol's sum into the round's delta.
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "federated/privacy.h"
#include "federated/round_calls.h"
#include "federated/rounds.h"
#include "federated/secagg.h"
#include "federated/secure_client.h"

namespace krab::federated {
namespace {

// Every message must carry the id the server assigned to the connection it came on: a client
// that claims another id could take that client's place in the sum, or (an id outside the
// cohort) make the server index out of bounds.
void require_id(uint64_t assigned, uint64_t claimed, const char* message) {
  if (claimed != assigned)
    throw CorruptData(
        str_cat(message, " claims client id ", claimed, "; this client's id is ", assigned));
}

}  // namespace

// One secure round: the protocol server, who is still in and what each reported. Lives for one
// call of secure_delta; a nested class so it can use the runner's options and checks.
class RoundRunner::SecureRound {
 public:
  SecureRound(RoundRunner& runner, RoundRecord& rec);

  // Returns the delta, or an undefined tensor after recording why the round failed.
  at::Tensor run(std::vector<Fitted>& fitted);

 private:
  using MakeRequest = std::function<SecAggRequest(uint64_t id)>;
  using TakeReply = std::function<void(const std::vector<uint8_t>& reply, const Fitted& from)>;

  // Round 0: the keys each fit reply carried; a participant whose keys or example count are
  // refused is rejected (never enters the protocol).
  void receive_keys(std::vector<Fitted>& fitted);
  // Rounds 1-3. Returns why the round cannot go on, "" once all three ran; a participant that
  // fails a stage is only dropped.
  std::string run_stages(double total_examples);
  // One stage: calls every live participant (in parallel if asked), feeds the replies to the
  // server and drops the ones that fail.
  void stage(SecAggRequest::Stage st, const MakeRequest& make_request, const TakeReply& take_reply);
  // A TakeReply that parses `Message`, checks its sender's id and hands it to the server.
  template <typename Message>
  TakeReply receive_as(const char* name);
  // The round's delta from the protocol's sum of the counted clients' weighted updates.
  at::Tensor delta(const secagg::Result& result, double total_examples);
  at::Tensor fail(const std::string& why);

  RoundRunner& runner_;
  const FederatedOptions& options_;
  RoundRecord& rec_;
  secagg::Server server_;
  std::map<uint64_t, Fitted*> live_;     // who is still in, by protocol id (position + 1)
  std::map<uint64_t, double> examples_;  // reported example counts, by protocol id
};

namespace {

// The protocol config both sides derive from the round (secure_client.h: secagg_config).
secagg::Config server_config(const RoundRecord& rec, size_t threshold, double clip,
                             size_t vector_length) {
  FitInstruction ins;
  ins.round = rec.round;
  ins.secagg_clients = rec.cohort.size();
  ins.secagg_threshold = threshold;
  ins.secagg_clip = clip;
  return secagg_config(ins, vector_length);
}

}  // namespace

RoundRunner::SecureRound::SecureRound(RoundRunner& runner, RoundRecord& rec)
    : runner_(runner),
      options_(runner.options_),
      rec_(rec),
      server_(server_config(rec, runner.secagg_threshold(rec.cohort.size()),
                            runner.options_.secagg_clip,
                            static_cast<size_t>(runner.global_.numel()))) {}

at::Tensor RoundRunner::SecureRound::run(std::vector<Fitted>& fitted) {
  receive_keys(fitted);
  double total = 0;
  for (const auto& [id, n] : examples_) total += n;
  std::string why = run_stages(total);
  if (!why.empty()) return fail(why);
  const secagg::Result* result = nullptr;
  why = try_call([&] { result = &server_.result(); });
  if (!why.empty()) return fail(why);
  // A client whose unmasking shares were bad is out of the rest of the round; the protocol has
  // already summed its masked update, and only its answer could be set aside.
  for (uint64_t id : result->bad_shares)
    rec_.dropped.push_back(
        {live_.at(id)->who->id(),
         "its round-3 shares disagree with the secrets the others' reconstruct (answer set aside; "
         "its masked update stays in the sum)"});
  return delta(*result, total);
}

void RoundRunner::SecureRound::receive_keys(std::vector<Fitted>& fitted) {
  for (auto& f : fitted) {
    const std::string why = try_call([&] {
      const auto msg = secagg::AdvertiseKeys::from_bytes(f.reply.secagg);
      require_id(f.secagg_id, msg.client_id, "AdvertiseKeys");
      const std::string bad = runner_.check_examples(f.who->id(), f.reply.num_examples);
      if (!bad.empty()) throw InvalidArgument(bad);
      server_.receive(msg);
      live_[f.secagg_id] = &f;
      examples_[f.secagg_id] = static_cast<double>(f.reply.num_examples);
    });
    if (!why.empty()) rec_.rejected.push_back({f.who->id(), why});
  }
}

template <typename Message>
RoundRunner::SecureRound::TakeReply RoundRunner::SecureRound::receive_as(const char* name) {
  return [this, name](const std::vector<uint8_t>& bytes, const Fitted& from) {
    const auto msg = Message::from_bytes(bytes);
    require_id(from.secagg_id, msg.client_id, name);
    server_.receive(msg);
  };
}

std::string RoundRunner::SecureRound::run_stages(double total_examples) {
  const bool dp = options_.dp != DpMode::kNone;
  std::vector<uint8_t> roster;
  std::string why = try_call([&] { roster = server_.roster().to_bytes(); });
  if (!why.empty()) return why;
  stage(
      SecAggRequest::kShareKeys,
      [&](uint64_t id) {
        SecAggRequest r;
        r.weight = dp ? 1.0 : examples_[id] / total_examples;
        r.payload = roster;
        return r;
      },
      receive_as<secagg::ShareKeys>("ShareKeys"));

  // shares_for() closes round 1; a client that never shared has no inbox and is not asked.
  std::map<uint64_t, std::vector<uint8_t>> inbox;
  why = try_call([&] {
    for (const auto& [id, f] : live_) inbox[id] = server_.shares_for(id).to_bytes();
  });
  if (!why.empty()) return why;
  stage(
      SecAggRequest::kMaskedInput,
      [&](uint64_t id) {
        SecAggRequest r;
        r.payload = inbox[id];
        return r;
      },
      receive_as<secagg::MaskedInput>("MaskedInput"));

  std::vector<uint8_t> request;
  why = try_call([&] { request = server_.unmask_request().to_bytes(); });
  if (!why.empty()) return why;
  stage(
      SecAggRequest::kUnmask,
      [&](uint64_t) {
        SecAggRequest r;
        r.payload = request;
        return r;
      },
      receive_as<secagg::UnmaskResponse>("UnmaskResponse"));
  return "";
}

void RoundRunner::SecureRound::stage(SecAggRequest::Stage st, const MakeRequest& make_request,
                                     const TakeReply& take_reply) {
  std::vector<std::pair<uint64_t, Fitted*>> who(live_.begin(), live_.end());
  std::vector<SecAggRequest> requests(who.size());
  for (size_t i = 0; i < who.size(); ++i) {
    requests[i] = make_request(who[i].first);
    requests[i].stage = st;
  }
  std::vector<std::vector<uint8_t>> replies(who.size());
  std::vector<std::string> errors(who.size());
  for_each_index(who.size(), runner_.parallel_calls_, [&](size_t i) {
    errors[i] = try_call([&] { replies[i] = who[i].second->who->secagg(requests[i]); });
  });
  for (size_t i = 0; i < who.size(); ++i) {
    if (errors[i].empty() || who[i].second->who->last_request_sent())
      rec_.bytes_down += static_cast<int64_t>(requests[i].payload.size()) + 16;
    if (errors[i].empty()) {
      rec_.bytes_up += static_cast<int64_t>(replies[i].size()) + 16;
      errors[i] = try_call([&] { take_reply(replies[i], *who[i].second); });
    }
    if (!errors[i].empty()) {
      rec_.dropped.push_back({who[i].second->who->id(), errors[i]});
      live_.erase(who[i].first);
    }
  }
}

at::Tensor RoundRunner::SecureRound::delta(const secagg::Result& result, double total_examples) {
  if (options_.dp != DpMode::kCentral &&
      static_cast<int64_t>(result.counted.size()) < options_.min_clients)
    return fail(str_cat(result.counted.size(), " client(s) in the sum, federated.min_clients is ",
                        options_.min_clients));
  double counted_examples = 0;
  for (uint64_t id : result.counted) {
    // Ids reach the result only through messages checked above, so each names a live entry.
    KRAB_CHECK(id >= 1 && id <= rec_.cohort.size() && examples_.count(id) == 1,
               "secure aggregation counted unknown client id ", id);
    counted_examples += examples_[id];
    rec_.counted.push_back(rec_.cohort[id - 1]);
  }
  at::Tensor sum = torch::from_blob(const_cast<float*>(result.sum.data()),
                                    {static_cast<int64_t>(result.sum.size())}, torch::kFloat)
                       .clone();
  // Renormalise the weights over the counted clients.
  if (options_.dp == DpMode::kNone) return sum * (total_examples / counted_examples);
  if (options_.dp == DpMode::kLocal) return sum / static_cast<double>(result.counted.size());
  sum = add_gaussian_noise(sum, options_.dp_noise_multiplier * options_.dp_clip);
  return sum / runner_.expected_cohort(rec_);
}

at::Tensor RoundRunner::SecureRound::fail(const std::string& why) {
  rec_.failure = "secure aggregation: " + why;
  return at::Tensor();
}

at::Tensor RoundRunner::secure_delta(std::vector<Fitted>& fitted, RoundRecord& rec) {
  return SecureRound(*this, rec).run(fitted);
}

}  // namespace krab::federated
