#include "federated/client_policy.h"

#include <cmath>

#include "core/errors.h"

namespace krab::federated {

void check_fit(const ClientPolicy& p, const FitInstruction& ins) {
  const std::string who = str_cat("the server's round ", ins.round, " ");
  KRAB_CHECK_ARG(!p.require_secure || ins.secure, who,
                 "is not securely aggregated (--require-secure-aggregation)");
  if (ins.secure) {
    const size_t t = ins.secagg_threshold, n = ins.secagg_clients;
    KRAB_CHECK_ARG(t >= 2 && 2 * t > n, who, "uses a secure-aggregation threshold t = ", t, " for ",
                   n, " clients; a safe protocol needs t >= 2 and 2t > n");
  }
  if (p.min_local_noise > 0) {
    const double multiplier = ins.clip_norm > 0 ? ins.local_noise_std / ins.clip_norm : 0.0;
    KRAB_CHECK_ARG(ins.clip_norm > 0 && multiplier >= p.min_local_noise, who,
                   "asks for local noise multiplier ", multiplier, " (clip ", ins.clip_norm,
                   ", noise std ", ins.local_noise_std, "); --min-local-noise is ",
                   p.min_local_noise);
  }
  if (p.max_clip > 0)
    KRAB_CHECK_ARG(ins.clip_norm > 0 && ins.clip_norm <= p.max_clip, who, "clips at ",
                   ins.clip_norm, " (0 = not at all); --max-clip is ", p.max_clip);
}

void check_weight(const ClientPolicy& p, double weight) {
  KRAB_CHECK_ARG(std::isfinite(weight) && weight > 0 && weight <= p.max_weight,
                 "the server puts weight ", weight, " on this client's update; --max-weight is ",
                 p.max_weight);
}

}  // namespace krab::federated
