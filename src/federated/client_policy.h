// What a federated client insists on, whatever the server asks.
//
// The server sends each round's privacy settings with the task (FitInstruction). A client that
// took them on trust could be told by a malicious or misconfigured server to switch secure
// aggregation or its own noise off, to clip at a huge norm, to use a Shamir threshold that lets
// the server unmask single clients (2t <= n), or to weight its update so heavily that the "sum"
// is its update alone. A ClientPolicy is the client's own minimum, set on its command line
// (`krab fl-client --require-secure-aggregation --min-local-noise S --max-clip C --max-weight W`);
// check_fit() and check_weight() throw InvalidArgument naming the flag the server's request
// breaks, and the client leaves the federation (exit 2) rather than train.
//
// Always enforced, flag or not: with secure aggregation, 2t > n (a server that may equivocate
// can otherwise reconstruct both secrets of a client, Bonawitz et al. 2017, section 6) and t >= 2.
//
// Pure; no state.
#pragma once

#include "federated/rounds.h"

namespace krab::federated {

struct ClientPolicy {
  bool require_secure = false;  // --require-secure-aggregation
  double min_local_noise = 0;   // --min-local-noise: local noise std / clip >= this; 0 = off
  double max_clip = 0;          // --max-clip: clip norm must be > 0 and <= this; 0 = off
  double max_weight = 1;        // --max-weight: secure rounds' weight on this update; 1 = off
};

// Checks a round's fit instruction against the policy (and the always-on threshold rule).
void check_fit(const ClientPolicy& policy, const FitInstruction& instruction);

// Checks the weight a secure round's ShareKeys request puts on this client's update.
void check_weight(const ClientPolicy& policy, double weight);

}  // namespace krab::federated
