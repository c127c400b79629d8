// The restore protocol's local steps (checkpoint_reader.h: verify_restore, install_restore):
// which ranges of which parameters this rank needs, and where they go.
#include <torch/torch.h>

#include <unordered_map>

#include "core/errors.h"
#include "core/printable.h"
#include "engine/sharded_state.h"
#include "models/model.h"
#include "train/checkpoint_reader.h"
#include "train/optimizer_state.h"

namespace krab::train {
namespace {

using engine::ShardedState;
using engine::TrainState;

torch::optim::Optimizer* any_optimizer(const TrainState& state) {
  if (state.optimizer != nullptr) return state.optimizer;
  if (state.sharded != nullptr && !state.sharded->optimizers.empty())
    return state.sharded->optimizers[0];
  return nullptr;
}

// The model's parameters that no unit of the sharded layout holds (frozen ones): replicated,
// read whole from the checkpoint. For a full replica: every parameter.
std::vector<std::pair<std::string, at::Tensor>> whole_params(const TrainState& state) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : state.model->named_parameters())
    if (state.sharded == nullptr || !state.sharded->layout->locate(item.key()))
      out.emplace_back(item.key(), item.value());
  return out;
}

// Where this rank reads unit u's optimizer step count and fields: its first piece (a place
// inside the shards it verified), or, for a shard that is all padding, the unit's first
// element. Name "" for a unit without elements.
struct Lead {
  std::string param;
  int64_t at = 0;
};
Lead lead_of(const engine::ShardLayout& layout, int u, int rank) {
  const auto mine = layout.pieces(u, layout.shard(u, rank));
  if (!mine.empty()) return {layout.unit(u).params[mine[0].param].name, mine[0].param_offset};
  for (const auto& p : layout.unit(u).params)
    if (p.numel > 0) return {p.name, 0};
  return {};
}

// Every piece of a unit's shard must carry the same optimizer fields and step count: the
// shard is stepped by one optimizer. A checkpoint of this krab has that (every trainable
// parameter is stepped every step), but one of another optimizer setup might not.
void check_unit_state(StateReader& reader, const engine::ShardLayout& layout, int u, int rank) {
  const Lead lead = lead_of(layout, u, rank);
  if (lead.param.empty()) return;
  reader.verify(lead.param, lead.at, 1);
  const auto step = reader.step_count(lead.param, lead.at);
  for (const auto& piece : layout.pieces(u, layout.shard(u, rank))) {
    const std::string& name = layout.unit(u).params[piece.param].name;
    bool same = reader.step_count(name, piece.param_offset) == step;
    for (const std::string& f : state_fields(reader.optimizer_type()))
      same = same && reader.has_field(name, f, piece.param_offset) ==
                         reader.has_field(lead.param, f, lead.at);
    if (!same)
      throw InvalidArgument(str_cat("checkpoint '", reader.source(), "': parameters '", lead.param,
                                    "' and '", name, "' of unit '", layout.unit(u).name,
                                    "' have different optimizer state; they cannot share a shard"));
  }
}

void verify_sharded(StateReader& reader, const TrainState& state) {
  const ShardedState& s = *state.sharded;
  const engine::ShardLayout& layout = *s.layout;
  KRAB_CHECK(static_cast<int>(s.values.size()) == layout.num_units() &&
                 s.optimizers.size() == s.values.size(),
             "sharded state: ", s.values.size(), " values, ", s.optimizers.size(),
             " optimizers for ", layout.num_units(), " units");
  for (int u = 0; u < layout.num_units(); ++u) {
    const at::Tensor& v = s.values[u];
    KRAB_CHECK(
        v.scalar_type() == at::kFloat && v.is_contiguous() && v.numel() == layout.shard_numel(u),
        "sharded state: values[", u, "] is not fp32 [", layout.shard_numel(u), "]");
    for (const auto& piece : layout.pieces(u, layout.shard(u, state.shard)))
      reader.verify(layout.unit(u).params[piece.param].name, piece.param_offset, piece.length);
    check_unit_state(reader, layout, u, state.shard);
  }
}

// Fills `dst` (fp32 [S_u], zeroed) with `field` of the pieces of this rank's shard of unit u.
void read_shard(StateReader& reader, const engine::ShardLayout& layout, int u, int rank,
                const std::string& field, at::Tensor& dst) {
  const engine::Range range = layout.shard(u, rank);
  float* base = dst.data_ptr<float>();
  for (const auto& piece : layout.pieces(u, range))
    reader.read(layout.unit(u).params[piece.param].name, field, piece.param_offset, piece.length,
                base + (piece.flat_offset - range.begin));
}

void install_sharded(StateReader& reader, const TrainState& state) {
  const ShardedState& s = *state.sharded;
  const engine::ShardLayout& layout = *s.layout;
  for (int u = 0; u < layout.num_units(); ++u) {
    at::Tensor values = s.values[u];
    values.zero_();  // padding is 0 by contract
    read_shard(reader, layout, u, state.shard, "value", values);
    torch::optim::Optimizer& opt = *s.optimizers[u];
    set_group_options(opt, reader.optimizer_options());
    ParamStateValues st;
    const Lead lead = lead_of(layout, u, state.shard);
    if (!lead.param.empty()) {
      st.step = reader.step_count(lead.param, lead.at);
      for (const std::string& f : state_fields(reader.optimizer_type())) {
        if (!reader.has_field(lead.param, f, lead.at)) continue;
        at::Tensor t = at::zeros_like(values);
        read_shard(reader, layout, u, state.shard, f, t);
        st.fields[f] = t;
      }
    }
    install_param_state(opt, opt.param_groups().at(0).params().at(0), st);
  }
}

void install_full(StateReader& reader, const TrainState& state) {
  torch::optim::Optimizer& opt = *state.optimizer;
  set_group_options(opt, reader.optimizer_options());
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : state.model->named_parameters())
    names[item.value().unsafeGetTensorImpl()] = item.key();
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      const auto name = names.find(p.unsafeGetTensorImpl());
      KRAB_CHECK(name != names.end(), "the optimizer steps a tensor that is not a parameter");
      ParamStateValues st;
      st.step = reader.step_count(name->second);
      for (const std::string& f : state_fields(reader.optimizer_type())) {
        if (!reader.has_field(name->second, f)) continue;
        at::Tensor t = at::empty(p.sizes(), p.options().dtype(at::kFloat));
        reader.read(name->second, f, 0, t.numel(), t.data_ptr<float>());
        st.fields[f] = t;
      }
      install_param_state(opt, p, st);
    }
}

}  // namespace

void verify_restore(StateReader& reader, const CheckpointMeta& expect, const TrainState& state) {
  check_resumable(reader.meta(), expect, reader.source());
  torch::optim::Optimizer* opt = any_optimizer(state);
  KRAB_CHECK(opt != nullptr, "restoring a TrainState without an optimizer");
  if (reader.optimizer_type() != optimizer_type(*opt))
    throw InvalidArgument(str_cat(reader.source(), " holds the state of optimizer '",
                                  core::printable(reader.optimizer_type()),
                                  "'; this job's train.optimizer.name is '", optimizer_type(*opt),
                                  "'"));
  for (const auto& [name, p] : whole_params(state)) {
    KRAB_CHECK(p.scalar_type() == at::kFloat, "parameter ", name, " is not fp32");
    reader.verify(name);
  }
  if (state.sharded != nullptr) verify_sharded(reader, state);
  const core::Record& rep = reader.replicated();
  for (const auto& item : state.model->named_buffers()) {
    const at::Tensor& t = rep.tensor("buffer." + item.key());
    if (t.sizes() != item.value().sizes() || t.scalar_type() != item.value().scalar_type())
      throw CorruptData(str_cat("checkpoint '", rep.source(), "': 'buffer.", item.key(), "' is ",
                                t.sizes(), " ", t.scalar_type(), ", the model's ",
                                item.value().sizes(), " ", item.value().scalar_type()));
  }
  check_generator_state(rep.tensor("rng"), rep.source());
}

CheckpointMeta install_restore(StateReader& reader, const TrainState& state) {
  torch::NoGradGuard no_grad;
  // Straight into the tensors: a contiguous parameter is its own destination (no copy of the
  // model), another goes through one temporary.
  for (auto& [name, p] : whole_params(state)) {
    at::Tensor dst = p.is_contiguous() ? p : at::empty_like(p, at::MemoryFormat::Contiguous);
    reader.read(name, "value", 0, dst.numel(), dst.data_ptr<float>());
    if (!dst.is_same(p)) p.copy_(dst);
  }
  if (state.sharded != nullptr)
    install_sharded(reader, state);
  else
    install_full(reader, state);
  const core::Record& rep = reader.replicated();
  for (const auto& item : state.model->named_buffers())
    item.value().copy_(rep.tensor("buffer." + item.key()));
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rep.tensor("rng"));
  return reader.meta();
}

}  // namespace krab::train
