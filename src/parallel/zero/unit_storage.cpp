#include "parallel/zero/unit_storage.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "models/model.h"

namespace krab::parallel::zero {

std::vector<std::vector<at::Tensor>> params_by_unit(const engine::ShardLayout& layout,
                                                    models::Model& model) {
  const auto named = model.named_parameters();
  std::vector<std::vector<at::Tensor>> out(layout.num_units());
  for (int u = 0; u < layout.num_units(); ++u)
    for (const auto& span : layout.unit(u).params) out[u].push_back(named[span.name]);
  return out;
}

at::Tensor flatten_into_views(const engine::UnitLayout& unit, const std::vector<at::Tensor>& params,
                              const char* owner, bool copy_values) {
  KRAB_CHECK_ARG(params.size() == unit.params.size(), owner, ": unit '", unit.name, "' has ",
                 unit.params.size(), " parameters in the layout, ", params.size(), " given");
  torch::NoGradGuard no_grad;
  // Zeros: the padding must be exactly 0 (an optimizer step then keeps it 0, §1.4).
  at::Tensor flat = torch::zeros({unit.padded}, torch::kFloat);
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const engine::ParamSpan& span = unit.params[i];
    at::Tensor p = params[i];
    KRAB_CHECK_ARG(p.scalar_type() == at::kFloat && p.device().is_cpu(),
                   "parallel.zero_stage: parameter '", span.name,
                   "' must be a float32 CPU tensor, got ", p.scalar_type(), " on ", p.device());
    KRAB_CHECK_ARG(p.sizes().vec() == span.shape, owner, ": parameter '", span.name, "' has shape ",
                   p.sizes(), ", the layout says ", at::IntArrayRef(span.shape));
    if (copy_values) flat.narrow(0, span.offset, span.numel).view(span.shape).copy_(p);
    p.set_data(flat.narrow(0, span.offset, span.numel).view(span.shape));
  }
  return flat;
}

UnitStorage::UnitStorage(const engine::ShardLayout& layout,
                         const std::vector<std::vector<at::Tensor>>& params, int rank) {
  KRAB_CHECK_ARG(static_cast<int>(params.size()) == layout.num_units(),
                 "UnitStorage: ", params.size(), " parameter lists for ", layout.num_units(),
                 " units");
  for (int u = 0; u < layout.num_units(); ++u) {
    at::Tensor flat = flatten_into_views(layout.unit(u), params[u], "UnitStorage");
    const engine::Range r = layout.shard(u, rank);
    shards_.push_back(flat.narrow(0, r.begin, r.size()));
    flats_.push_back(std::move(flat));
  }
  pending_.resize(flats_.size());
}

// Gloo threads may still write into the flats: never free them under a gather.
UnitStorage::~UnitStorage() {
  try {
    wait();
  } catch (...) {  // the error was (or will be) reported by whoever waited first
  }
}

void UnitStorage::start_gather(comm::Communicator& comm, const std::vector<int>& order) {
  wait();
  std::vector<int> units = order;
  if (units.empty())
    for (int u = 0; u < num_units(); ++u) units.push_back(u);
  for (int u : units) {
    if (flats_.at(u).numel() == 0) continue;
    Pending& p = pending_[u];
    KRAB_CHECK(p.work == nullptr, "UnitStorage: unit ", u, " twice in the gather order");
    p.input = shards_[u].clone();
    p.work = comm.allgather(p.input, flats_[u]);
  }
  for (int u = 0; u < num_units(); ++u)
    KRAB_CHECK(flats_[u].numel() == 0 || pending_[u].work != nullptr, "UnitStorage: unit ", u,
               " is missing from the gather order");
}

void UnitStorage::wait(int unit) {
  Pending& p = pending_.at(unit);
  if (p.work == nullptr) return;
  // Forget the gather before waiting: a failed one is reported once, here, and not again by
  // the next wait() (whose caller would otherwise see an error that was already thrown).
  Pending done = std::move(p);
  p = Pending{};
  done.work->wait();
}

void UnitStorage::wait() {
  // Wait for all before rethrowing, so that no gather is left writing into a flat.
  std::exception_ptr first;
  for (int u = 0; u < num_units(); ++u) try {
      wait(u);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  if (first) std::rethrow_exception(first);
}

bool UnitStorage::gathering() const {
  for (const Pending& p : pending_)
    if (p.work != nullptr) return true;
  return false;
}

int64_t UnitStorage::bytes() const {
  int64_t total = 0;
  for (const auto& f : flats_) total += static_cast<int64_t>(f.nbytes());
  return total;
}

}  // namespace krab::parallel::zero
