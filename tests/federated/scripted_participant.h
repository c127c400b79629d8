// Scripted participants for the round-loop tests (rounds_test.cpp, round_checks_test.cpp):
// clients whose updates are fixed, so every expectation is arithmetic done in the test.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "federated/rounds.h"
#include "federated/secure_client.h"

namespace krab::federated {

// A client that returns a fixed update (or fails at a chosen point).
class Scripted : public Participant {
 public:
  Scripted(std::string id, at::Tensor update, int64_t examples, int fail_at = -1)
      : id_(std::move(id)), update_(std::move(update)), examples_(examples), fail_at_(fail_at) {}
  const std::string& id() const override { return id_; }
  FitReply fit(const FitInstruction& ins) override {
    if (fail_at_ == 0) throw PeerLost(id_ + " went away");
    seen_global_ = ins.global;
    FitReply r;
    r.num_examples = examples_;
    r.mean_loss = 1.0;
    at::Tensor u = update_;
    if (ins.clip_norm > 0) u = u * std::min(1.0, ins.clip_norm / u.norm().item<double>());
    if (!ins.secure) {
      r.update = u;
      return r;
    }
    secure_ = std::make_unique<SecureClient>(ins, u);
    r.secagg = secure_->advertise();
    return r;
  }
  std::vector<uint8_t> secagg(const SecAggRequest& req) override {
    if (fail_at_ == static_cast<int>(req.stage)) throw PeerLost(id_ + " lost in stage");
    std::vector<uint8_t> out = secure_->handle(req);
    if (truncate_at_ == static_cast<int>(req.stage)) out.resize(out.size() - 5);
    return out;
  }
  int truncate_at_ = -1;  // secure rounds: cut 5 bytes off this stage's message
  at::Tensor seen_global_;

 private:
  std::string id_;
  at::Tensor update_;
  int64_t examples_;
  int fail_at_;
  std::unique_ptr<SecureClient> secure_;
};

inline FederatedOptions all_clients(int64_t min_clients = 1) {
  FederatedOptions o;
  o.fraction = 1.0;
  o.min_clients = min_clients;
  o.rounds = 3;
  return o;
}

inline std::vector<Participant*> ptrs(std::vector<std::unique_ptr<Scripted>>& v) {
  std::vector<Participant*> out;
  for (auto& p : v) out.push_back(p.get());
  return out;
}

}  // namespace krab::federated
