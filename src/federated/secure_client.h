// The client's side of a secure round, between the transport and secagg::Client.
//
// A secure round (rounds.h, federated.secure_aggregation) runs fit and then three more
// exchanges. After fit, the client keeps its update and answers with its AdvertiseKeys
// message; then, for each SecAggRequest the server sends:
//
//   kShareKeys    payload = the Roster; request.weight = the factor w this client's update is
//                 scaled by (its share of the cohort's examples, or 1 under DP) -> ShareKeys
//   kMaskedInput  payload = IncomingShares -> MaskedInput of w * update (fixed point, masked)
//   kUnmask       payload = UnmaskRequest -> UnmaskResponse (after secagg::Client's refusals:
//                 this is where a server asking for both secrets of one client is turned away)
//
// The update never leaves this object unmasked. The protocol config is rebuilt from the fit
// instruction (round, threshold, cohort size, clip), so client and server agree on it without
// another message; a mismatch makes the server's checks fail, never a silent wrong sum.
// Errors: InvalidArgument for a request out of order or refused, CorruptData for bytes that do
// not parse (both from secagg.h). One object per round; not thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "federated/rounds.h"
#include "federated/secagg.h"

namespace krab::federated {

// The protocol config both sides derive from a secure fit instruction.
secagg::Config secagg_config(const FitInstruction& instruction, size_t vector_length);

class SecureClient {
 public:
  // `update`: the 1-D float32 update fit produced (already clipped / noised as instructed).
  SecureClient(const FitInstruction& instruction, at::Tensor update);
  ~SecureClient();

  std::vector<uint8_t> advertise();
  std::vector<uint8_t> handle(const SecAggRequest& request);

 private:
  std::unique_ptr<secagg::Client> client_;
  at::Tensor update_;
  double weight_ = 0;
  bool weighted_ = false;
};

}  // namespace krab::federated
