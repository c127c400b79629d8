// UnitStorage: the parameters of ZeRO stages 1-2 as views into one flat fp32 storage per unit
// (docs/design/zero-sharding.md §1.3, §3.2).
//
// For every unit u of a ShardLayout it allocates flat_u = fp32 [padded_u], copies each of the
// unit's parameters into its span (ShardLayout's offsets), zeroes the padding, and points the
// parameter at its span once, with p.set_data(flat.narrow(0, offset, numel).view(shape)): the
// Parameter keeps its TensorImpl, dtype and device, so the optimizer handles, the model's
// registration and the gradient accumulator (with its hooks) all stay valid (§12, check 2).
// From then on a write into flat_u is a write into the parameters and vice versa.
//
// Rank r owns shard(u) = flat_u[r · S_u, (r + 1) · S_u), a view: the optimizer steps it in
// place. start_gather() then all-gathers every rank's shard into every rank's flat, so the
// parameters are whole and equal on all ranks again. The gathers are asynchronous: nothing may
// read or write a unit's parameters between start_gather() and wait(unit) or wait() (the
// engine waits each unit right before its forward reads it — gather_wait_runner.h — and
// everything before the update, evaluation and checkpoints: Engine::settle()).
//
// Units of 0 elements have an empty flat and take part in no collective (the comm frame rule
// that memory_model.h's traffic counts assume).
//
// Thread safety: the training thread only. The parameters must outlive this object; the flats
// are held here (and by the parameters, which share their storage).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "engine/shard_layout.h"

namespace krab::models {
class Model;
}

namespace krab::parallel::zero {

// The trainable parameters of `model` by unit, in layout order (ShardLayout's spans name them).
std::vector<std::vector<at::Tensor>> params_by_unit(const engine::ShardLayout& layout,
                                                    models::Model& model);

// Allocates unit's flat fp32 [padded] storage (padding 0), copies `params` (the unit's
// parameters, in span order) into their spans and points each parameter at its span with
// set_data (same TensorImpl, dtype and device: the grad accumulator and its hooks stay, and the
// parameter's old storage goes once nothing else holds it). Returns the flat. InvalidArgument
// naming the parameter for one that is not a float32 CPU tensor of its span's shape; `owner`
// names the caller in the other messages. Without `copy_values` the flat stays 0 and the
// parameters' values are not read (a stage-3 parameter whose unit is freed has none): the
// caller fills the flat.
at::Tensor flatten_into_views(const engine::UnitLayout& unit, const std::vector<at::Tensor>& params,
                              const char* owner, bool copy_values = true);

class UnitStorage {
 public:
  // `params[u][i]` is the tensor of layout.unit(u).params[i] (same shape, fp32, on the CPU;
  // checked, InvalidArgument naming the parameter otherwise). `rank` is this rank's index in
  // the layout's world. The parameters' current values become the flats' contents.
  UnitStorage(const engine::ShardLayout& layout, const std::vector<std::vector<at::Tensor>>& params,
              int rank);
  ~UnitStorage();
  UnitStorage(const UnitStorage&) = delete;
  UnitStorage& operator=(const UnitStorage&) = delete;

  int num_units() const { return static_cast<int>(flats_.size()); }
  // flat_u: fp32 [padded_u].
  const at::Tensor& flat(int unit) const { return flats_.at(unit); }
  // This rank's shard of unit u: a view of flat_u, fp32 [S_u].
  const at::Tensor& shard(int unit) const { return shards_.at(unit); }

  // Starts the all-gather of every non-empty unit's shard into its flat, in `order` (every
  // unit with elements exactly once, units of 0 elements optional; empty: unit order; an
  // internal error otherwise). Every rank must pass the same order:
  // the same collectives in the same order on every rank. Each shard is copied to a temporary
  // first: an all-gather's input must not alias its output. Waits for gathers still pending.
  void start_gather(comm::Communicator& comm, const std::vector<int>& order = {});
  // Waits for the pending gathers; rethrows the first communication error. No-op when none.
  void wait();
  // Waits for unit `unit`'s pending gather only, if any; rethrows its communication error.
  // The other units' gathers go on.
  void wait(int unit);
  bool gathering() const;
  // Whether unit `unit`'s gather was started and not yet waited (its flat may still change).
  bool pending(int unit) const { return pending_.at(unit).work != nullptr; }

  // Bytes of the flats (the parameters' storage).
  int64_t bytes() const;

 private:
  struct Pending {
    comm::WorkPtr work;
    at::Tensor input;  // the temporary copy of the shard, alive until the gather is done
  };
  std::vector<at::Tensor> flats_;
  std::vector<at::Tensor> shards_;
  std::vector<Pending> pending_;  // by unit; work null: none in flight
};

}  // namespace krab::parallel::zero
