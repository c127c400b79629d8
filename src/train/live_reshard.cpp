#include "train/live_reshard.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <optional>

#include "comm/communicator.h"
#include "core/errors.h"
#include "core/record.h"
#include "elastic/transfer_plan.h"
#include "engine/sharded_state.h"
#include "models/model.h"
#include "train/checkpoint_reader.h"
#include "train/optimizer_state.h"

namespace krab::train {
namespace {

// Above the buddy exchange's tags (parallel/zero/buddy.h: 1 << 20 + unit): move m uses kTag + m.
constexpr int kTag = 1 << 24;

// What one process holds of the old generation, as the all-gather carries it.
struct Holding {
  int64_t old_rank = -1, old_world = 0, ward = -1;
  int64_t has_state = 0, step = -1, fields = 0;  // fields: bit f = state_fields()[f] present
};
constexpr int kHoldingInts = 6;

torch::optim::Optimizer& unit_optimizer(const engine::ShardedState& s, int u) {
  return *s.optimizers.at(u);
}
const at::Tensor& unit_param(const engine::ShardedState& s, int u) {
  return unit_optimizer(s, u).param_groups().at(0).params().at(0);
}

// The optimizer state of the shard: taken from its first unit that has elements (every unit
// of a shard is stepped together, restore.cpp's check_unit_state).
Holding holding_of(const engine::TrainState* prev, const std::string& type) {
  Holding h;
  if (prev == nullptr) return h;
  KRAB_CHECK(prev->sharded != nullptr, "reshard_live: the previous engine is not sharded");
  h.old_rank = prev->shard;
  h.old_world = prev->shards;
  h.ward = prev->ward != nullptr ? prev->ward_shard : -1;
  const engine::ShardedState& s = *prev->sharded;
  for (int u = 0; u < s.layout->num_units(); ++u) {
    if (s.layout->shard_numel(u) == 0) continue;
    const ParamStateValues v = param_state_values(unit_optimizer(s, u), unit_param(s, u));
    const auto& names = state_fields(type);
    for (size_t f = 0; f < names.size(); ++f)
      if (v.fields.count(names[f])) h.fields |= int64_t{1} << f;
    h.has_state = (v.step.has_value() || h.fields != 0) ? 1 : 0;
    h.step = v.step.value_or(-1);
    break;
  }
  return h;
}

std::vector<Holding> gather_holdings(comm::Communicator& group, const Holding& mine) {
  auto in = torch::tensor(
      {mine.old_rank, mine.old_world, mine.ward, mine.has_state, mine.step, mine.fields},
      torch::kInt64);
  auto out = torch::empty({group.size() * kHoldingInts}, torch::kInt64);
  group.allgather(in, out)->wait();
  std::vector<Holding> all(group.size());
  const int64_t* p = out.data_ptr<int64_t>();
  for (int r = 0; r < group.size(); ++r, p += kHoldingInts)
    all[r] = {p[0], p[1], p[2], p[3], p[4], p[5]};
  return all;
}

// One run of a parameter received (or copied) for this rank's new shard.
struct Segment {
  int64_t offset = 0, count = 0;
  at::Tensor data;  // fp32 [count × (1 + fields)]: values, then each field present
};

class PeerReader : public StateReader {
 public:
  PeerReader(const CheckpointMeta& meta, const engine::TrainState& target, const Holding& state,
             const std::string& type, std::map<std::string, double> options)
      : target_(target), state_(state) {
    meta_ = meta;
    source_ = "the running job's peers";
    sharded_ = true;
    optimizer_type_ = type;
    options_ = std::move(options);
    for (const auto& item : target.model->named_parameters())
      params_.push_back({item.key(), item.value().sizes().vec()});
    const auto& names = state_fields(type);
    for (size_t f = 0; f < names.size(); ++f)
      if (state.fields & (int64_t{1} << f)) present_.push_back(names[f]);
  }

  void add(const std::string& param, Segment s) { segments_[param].push_back(std::move(s)); }
  int fields() const { return static_cast<int>(present_.size()); }

  void verify(const std::string&, int64_t, int64_t) override {}

  void read(const std::string& param, const std::string& field, int64_t a, int64_t n,
            float* dst) override {
    const auto it = segments_.find(param);
    if (it == segments_.end()) return read_own(param, field, a, n, dst);
    const int slot = field == "value" ? 0 : field_slot(field);
    int64_t covered = 0;
    for (const Segment& s : it->second) {
      const int64_t lo = std::max(a, s.offset), hi = std::min(a + n, s.offset + s.count);
      if (lo >= hi) continue;
      const float* src = s.data.data_ptr<float>() + slot * s.count + (lo - s.offset);
      std::copy(src, src + (hi - lo), dst + (lo - a));
      covered += hi - lo;
    }
    KRAB_CHECK(covered == n, "reshard_live: ", covered, " of ", n, " elements of ", param, " at ",
               a, " arrived");
  }

  bool has_field(const std::string& param, const std::string& field, int64_t) override {
    if (field == "value") return true;
    return std::find(present_.begin(), present_.end(), field) != present_.end();
  }
  std::optional<int64_t> step_count(const std::string&, int64_t) override {
    if (!state_.has_state || state_.step < 0) return std::nullopt;
    return state_.step;
  }
  // This process's own buffers and generator: the new engine broadcast rank 0's buffers.
  const core::Record& replicated() override {
    if (!replicated_) {
      core::RecordWriter w;
      for (const auto& item : target_.model->named_buffers())
        w.add_tensor("buffer." + item.key(), item.value());
      w.add_tensor("rng", at::detail::getDefaultCPUGenerator().get_state());
      const std::string bytes = w.bytes();
      replicated_ = core::Record::parse(bytes.data(), bytes.size(), source_);
    }
    return *replicated_;
  }

 private:
  int field_slot(const std::string& field) const {
    const auto it = std::find(present_.begin(), present_.end(), field);
    KRAB_CHECK(it != present_.end(), "reshard_live: field ", field, " was not moved");
    return 1 + static_cast<int>(it - present_.begin());
  }
  // A parameter no unit holds (frozen): every process has it whole.
  void read_own(const std::string& param, const std::string& field, int64_t a, int64_t n,
                float* dst) {
    KRAB_CHECK(field == "value", "reshard_live: no state of ", param);
    for (const auto& item : target_.model->named_parameters())
      if (item.key() == param) {
        const at::Tensor t = item.value().detach().contiguous().view(-1);
        const float* src = t.data_ptr<float>() + a;
        if (src != dst) std::copy(src, src + n, dst);
        return;
      }
    throw InvalidArgument(str_cat("reshard_live: the model has no parameter ", param));
  }

  const engine::TrainState& target_;
  Holding state_;
  std::vector<std::string> present_;
  std::map<std::string, std::vector<Segment>> segments_;
  std::optional<core::Record> replicated_;
};

// The payload of `move` from this process's copy of its old shard: values, then each field.
at::Tensor payload(const engine::TrainState& prev, const engine::ShardLayout& old_layout,
                   const elastic::Move& move, const std::vector<std::string>& fields) {
  KRAB_CHECK(
      move.old_shard == prev.shard || (prev.ward != nullptr && move.old_shard == prev.ward_shard),
      "reshard_live: the plan reads old shard ", move.old_shard, " from rank ", prev.shard);
  const engine::ShardedState& s = move.old_shard == prev.shard ? *prev.sharded : *prev.ward;
  const engine::Loc loc = *old_layout.locate(move.param);
  const int64_t at = loc.offset + move.offset - old_layout.shard(loc.unit, move.old_shard).begin;
  std::vector<at::Tensor> parts{s.values.at(loc.unit).narrow(0, at, move.count)};
  if (!fields.empty()) {
    const ParamStateValues v =
        param_state_values(unit_optimizer(s, loc.unit), unit_param(s, loc.unit));
    for (const std::string& f : fields)
      parts.push_back(v.fields.at(f).view(-1).narrow(0, at, move.count));
  }
  return torch::cat(parts);
}

void wait_all(std::vector<comm::WorkPtr>& works) {
  std::exception_ptr first;
  for (auto& w : works) try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  if (first) std::rethrow_exception(first);
}

}  // namespace

void reshard_live(comm::Communicator& group, const engine::TrainState* previous,
                  const engine::TrainState& target,
                  const std::function<engine::ShardLayout(int world)>& layout_for,
                  const CheckpointMeta& meta) {
  KRAB_CHECK(target.sharded != nullptr && !target.sharded->optimizers.empty(),
             "reshard_live: the new engine is not sharded");
  torch::optim::Optimizer& new_opt = *target.sharded->optimizers[0];
  const std::string type = optimizer_type(new_opt);
  const std::vector<Holding> all = gather_holdings(group, holding_of(previous, type));
  // Survivors agree on the old world and on the state their shards carry.
  const Holding* ref = nullptr;
  std::vector<elastic::Holder> holders;
  for (int r = 0; r < group.size(); ++r) {
    const Holding& h = all[r];
    elastic::Holder holder{r, static_cast<int>(h.old_rank), {}};
    if (h.old_rank >= 0) {
      if (ref == nullptr) ref = &h;
      KRAB_CHECK(h.old_world == ref->old_world && h.has_state == ref->has_state &&
                     h.step == ref->step && h.fields == ref->fields,
                 "reshard_live: rank ", r, " holds another generation's state than rank ",
                 ref - all.data());
      holder.old_shards.push_back(static_cast<int>(h.old_rank));
      if (h.ward >= 0) holder.old_shards.push_back(static_cast<int>(h.ward));
    }
    holders.push_back(std::move(holder));
  }
  if (ref == nullptr) throw PeerLost("reshard_live: no process of the new group holds any state");
  const engine::ShardLayout old_layout = layout_for(static_cast<int>(ref->old_world));
  const engine::ShardLayout& new_layout = *target.sharded->layout;
  const elastic::TransferPlan plan =
      elastic::plan_transfer(old_layout, new_layout, holders, /*wards=*/false);

  PeerReader reader(meta, target, *ref, type,
                    previous != nullptr ? group_options(*previous->sharded->optimizers.at(0))
                                        : group_options(new_opt));
  std::vector<std::string> fields;
  for (const auto& f : state_fields(type))
    if (reader.has_field("", f, 0)) fields.push_back(f);
  const int me = group.rank();
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> held;  // sent payloads stay alive until their sends ended
  for (size_t m = 0; m < plan.moves.size(); ++m) {
    const elastic::Move& mv = plan.moves[m];
    if (mv.src != me && mv.dst != me) continue;
    const int tag = kTag + static_cast<int>(m);
    if (mv.src == me && mv.dst == me) {
      reader.add(mv.param, {mv.offset, mv.count, payload(*previous, old_layout, mv, fields)});
    } else if (mv.src == me) {
      held.push_back(payload(*previous, old_layout, mv, fields));
      works.push_back(group.send(held.back(), mv.dst, tag));
    } else {
      Segment s{mv.offset, mv.count,
                torch::empty({mv.count * (1 + reader.fields())}, torch::kFloat)};
      works.push_back(group.recv(s.data, mv.src, tag));
      reader.add(mv.param, std::move(s));
    }
  }
  wait_all(works);
  install_restore(reader, target);
}

}  // namespace krab::train
