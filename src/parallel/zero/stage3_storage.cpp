#include "parallel/zero/stage3_storage.h"

#include <ATen/native/Resize.h>
#include <torch/torch.h>

#include "core/errors.h"
#include "parallel/zero/unit_storage.h"

namespace krab::parallel::zero {

namespace {

void resize_bytes(const at::Tensor& flat, size_t bytes) {
  at::native::resize_bytes_cpu(flat.storage().unsafeGetStorageImpl(), bytes);
}

// The pool's blocks fit the largest unit but the root (which stays gathered): any block serves
// any unit, so units of different sizes do not map and unmap blocks every step.
size_t largest_unit_bytes(const engine::ShardLayout& layout) {
  int64_t largest = 0;
  for (int u = 1; u < layout.num_units(); ++u) largest = std::max(largest, layout.unit(u).padded);
  return static_cast<size_t>(largest) * sizeof(float);
}

}  // namespace

Stage3Storage::Stage3Storage(const engine::ShardLayout& layout, int rank,
                             std::unique_ptr<DiskOffload> offload, int ward)
    : layout_(layout),
      rank_(rank),
      ward_(ward),
      offload_(std::move(offload)),
      pool_(largest_unit_bytes(layout)),
      units_(layout.num_units()) {
  KRAB_CHECK(!offload_ || (offload_->regions().master &&
                           static_cast<int>(offload_->regions().numel.size()) == num_units()),
             "Stage3Storage: the offload file has no master region per unit");
  KRAB_CHECK_ARG(ward_ < 0 || !offload_,
                 "parallel.offload: disk cannot be combined with elastic.replicate_shards (the "
                 "ward masters would stay in RAM)");
  KRAB_CHECK(ward_ < layout.world(), "Stage3Storage: ward ", ward_, " outside the world");
}

// Gloo threads may still write into a flat: never drop one under a gather. The model's
// parameters may outlive this storage and share its flats: they must not name the pool.
Stage3Storage::~Stage3Storage() {
  for (auto& u : units_) {
    try {
      if (u.work) u.work->wait();
    } catch (...) {  // reported by whoever waited first
    }
    if (u.flat.defined())
      u.flat.storage().unsafeGetStorageImpl()->set_allocator(c10::GetCPUAllocator());
  }
}

bool Stage3Storage::all_adopted() const {
  for (const auto& u : units_)
    if (!u.adopted) return false;
  return true;
}

void Stage3Storage::adopt(int unit, const std::vector<at::Tensor>& params, comm::Communicator& comm,
                          bool keep_gathered) {
  KRAB_CHECK(!units_.at(unit).adopted, "Stage3Storage: unit ", unit, " adopted twice");
  const engine::UnitLayout& u = layout_.unit(unit);
  torch::NoGradGuard no_grad;
  at::Tensor flat = flatten_into_views(u, params, "Stage3Storage");
  // Thread-ranks share one generator and processes may differ in what they drew: rank 0's
  // values are the model's, as the data-parallel engine's initial broadcast makes them.
  if (u.padded > 0) comm.broadcast(flat, 0)->wait();
  keep(unit, std::move(flat), /*copy=*/true, keep_gathered);
}

void Stage3Storage::adopt_blank(int unit, const std::vector<at::Tensor>& params,
                                bool keep_gathered) {
  KRAB_CHECK(!units_.at(unit).adopted, "Stage3Storage: unit ", unit, " adopted twice");
  KRAB_CHECK(offload_ == nullptr, "Stage3Storage: a blank adoption with offload");
  torch::NoGradGuard no_grad;
  at::Tensor flat = flatten_into_views(layout_.unit(unit), params, "Stage3Storage", false);
  keep(unit, std::move(flat), /*copy=*/false, keep_gathered);
}

// The master (and ward master) of the adopted flat: copied out of it, or zeros of its size.
void Stage3Storage::keep(int unit, at::Tensor flat, bool copy, bool keep_gathered) {
  Unit& slot = units_.at(unit);
  const engine::Range r = layout_.shard(unit, rank_);
  const auto cut = [&](const engine::Range& range) {
    return copy ? flat.narrow(0, range.begin, range.size()).clone()
                : torch::zeros({range.size()}, torch::kFloat);
  };
  if (offload_) {
    KRAB_CHECK(offload_->regions().numel[unit] == r.size(),
               "Stage3Storage: the offload file's master of unit ", unit, " has another size");
    slot.master = offload_->master(unit);
    slot.master.copy_(flat.narrow(0, r.begin, r.size()));
    offload_->release_master(unit);
  } else {
    slot.master = cut(r);
  }
  if (ward_ >= 0) slot.ward_master = cut(layout_.shard(unit, ward_));
  // The flat's bytes so far came from malloc (freed below or kept: the root); every gather's
  // come from the pool (flat_pool.h).
  flat.storage().unsafeGetStorageImpl()->set_allocator(&pool_);
  slot.flat = std::move(flat);
  slot.adopted = true;
  live_bytes_ += static_cast<int64_t>(slot.flat.nbytes());
  note_peaks();
  if (!keep_gathered) free(unit);
}

bool Stage3Storage::allocated(int unit) const {
  const Unit& u = units_.at(unit);
  return u.flat.defined() && (u.flat.numel() == 0 || u.flat.storage().nbytes() > 0);
}

void Stage3Storage::allocate(int unit) {
  Unit& u = units_[unit];
  resize_bytes(u.flat, static_cast<size_t>(u.flat.numel()) * sizeof(float));
  live_bytes_ += static_cast<int64_t>(u.flat.nbytes());
  pooled_bytes_ += static_cast<int64_t>(u.flat.nbytes());
  u.pooled = true;
  note_peaks();
}

// The pool's blocks may be larger than the flats in them (whole pages, a kept block of a larger
// unit): count the blocks, in use and kept, in place of the pooled flats.
void Stage3Storage::note_peaks() {
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  const int64_t held = live_bytes_ - pooled_bytes_ + pool_.in_use_bytes() + pool_.kept_bytes();
  held_peak_bytes_ = std::max(held_peak_bytes_, held);
}

void Stage3Storage::start_gather(int unit, comm::Communicator& comm) {
  Unit& u = units_.at(unit);
  KRAB_CHECK(u.adopted, "Stage3Storage: unit ", unit, " gathered before it was adopted");
  if (u.flat.numel() == 0 || allocated(unit)) return;
  allocate(unit);
  if (offload_) offload_->prefetch_master(unit);
  u.work = comm.allgather(u.master, u.flat);
}

void Stage3Storage::refresh(int unit, comm::Communicator& comm) {
  Unit& u = units_.at(unit);
  KRAB_CHECK(u.adopted, "Stage3Storage: unit ", unit, " gathered before it was adopted");
  if (u.flat.numel() == 0) return;
  wait(unit);
  if (!allocated(unit)) allocate(unit);
  if (offload_) offload_->prefetch_master(unit);
  u.work = comm.allgather(u.master, u.flat);
}

void Stage3Storage::wait(int unit) {
  Unit& u = units_.at(unit);
  if (!u.work) return;
  comm::WorkPtr work = std::move(u.work);
  u.work = nullptr;
  // The master's pages go once the gather has read them, even when it failed.
  struct Release {
    const DiskOffload* offload;
    int unit;
    ~Release() {
      if (offload) offload->release_master(unit);
    }
  } release{offload_.get(), unit};
  work->wait();
}

void Stage3Storage::wait_all() {
  // Wait for all before rethrowing, so that no gather is left writing into a flat.
  std::exception_ptr first;
  for (int u = 0; u < num_units(); ++u) try {
      wait(u);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  if (first) std::rethrow_exception(first);
}

void Stage3Storage::free(int unit) {
  Unit& u = units_.at(unit);
  if (u.flat.numel() == 0 || !allocated(unit)) return;
  wait(unit);
  live_bytes_ -= static_cast<int64_t>(u.flat.nbytes());
  if (u.pooled) pooled_bytes_ -= static_cast<int64_t>(u.flat.nbytes());
  u.pooled = false;
  resize_bytes(u.flat, 0);
  note_peaks();  // the pool keeps what was freed
}

int64_t Stage3Storage::master_bytes() const {
  int64_t total = 0;
  for (const auto& u : units_)
    if (u.master.defined()) total += static_cast<int64_t>(u.master.nbytes());
  return total;
}

}  // namespace krab::parallel::zero
