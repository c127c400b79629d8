#include "federated/secure_client.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "federated/secagg.h"

namespace krab::federated {

secagg::Config secagg_config(const FitInstruction& ins, size_t vector_length) {
  secagg::Config c;
  c.round = static_cast<uint64_t>(ins.round);
  c.vector_length = vector_length;
  c.threshold = ins.secagg_threshold;
  c.clients = ins.secagg_clients;
  c.fp = secagg::FixedPoint::for_clients(ins.secagg_clip, ins.secagg_clients);
  c.validate();
  return c;
}

SecureClient::SecureClient(const FitInstruction& ins, at::Tensor update)
    : update_(update.contiguous().to(at::kFloat)) {
  // The fixed-point encoding has no NaN; a diverged client sits the round out, saying why.
  KRAB_CHECK_ARG(at::isfinite(update_).all().item<bool>(),
                 "the local update is not finite (local training diverged); not sent");
  client_ = std::make_unique<secagg::Client>(
      ins.secagg_id, secagg_config(ins, static_cast<size_t>(update_.numel())));
}

SecureClient::~SecureClient() = default;

std::vector<uint8_t> SecureClient::advertise() { return client_->advertise_keys().to_bytes(); }

std::vector<uint8_t> SecureClient::handle(const SecAggRequest& r) {
  switch (r.stage) {
    case SecAggRequest::kShareKeys:
      KRAB_CHECK_ARG(std::isfinite(r.weight) && r.weight > 0 && r.weight <= 1,
                     "secure aggregation: weight ", r.weight, " outside (0, 1]");
      weight_ = r.weight;
      weighted_ = true;
      return client_->share_keys(secagg::Roster::from_bytes(r.payload)).to_bytes();
    case SecAggRequest::kMaskedInput: {
      KRAB_CHECK_ARG(weighted_, "secure aggregation: masked-input request before share-keys");
      const at::Tensor w = (update_ * weight_).contiguous();
      const auto incoming = secagg::IncomingShares::from_bytes(r.payload);
      return client_->masked_input(incoming, w.data_ptr<float>(), static_cast<size_t>(w.numel()))
          .to_bytes();
    }
    case SecAggRequest::kUnmask:
      return client_->unmask(secagg::UnmaskRequest::from_bytes(r.payload)).to_bytes();
  }
  throw InvalidArgument(str_cat("secure aggregation: unknown stage ", static_cast<int>(r.stage)));
}

}  // namespace krab::federated
