#include "parallel/zero/offload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/errors.h"
#include "core/fs.h"
#include "parallel/zero/shard_optimizer.h"

namespace krab::parallel::zero {

namespace {

// The unit's optimizer fields as tensors over the mapping (after its master, if any).
std::vector<at::Tensor> field_views(char* base, const OffloadRegions& r, int u) {
  std::vector<at::Tensor> out;
  const int first = r.master ? 1 : 0;
  for (int f = first; f < first + r.fields[u]; ++f)
    out.push_back(
        torch::from_blob(base + r.offset[u] + f * r.numel[u] * 4, {r.numel[u]}, torch::kFloat32));
  return out;
}

std::string why() { return std::strerror(errno); }

}  // namespace

int64_t OffloadRegions::state_bytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

int64_t OffloadRegions::master_bytes() const {
  int64_t total = 0;
  if (master)
    for (int64_t n : numel) total += n * static_cast<int64_t>(sizeof(float));
  return total;
}

OffloadRegions plan_offload(const std::vector<int64_t>& numel, const std::vector<int>& fields,
                            int64_t page, bool master) {
  KRAB_CHECK(numel.size() == fields.size(), "plan_offload: numel and fields differ in length");
  OffloadRegions r;
  r.numel = numel;
  r.fields = fields;
  r.master = master;
  for (size_t u = 0; u < numel.size(); ++u) {
    r.offset.push_back(r.file_bytes);
    const int stored = fields[u] + (master ? 1 : 0);
    r.bytes.push_back(numel[u] * stored * static_cast<int64_t>(sizeof(float)));
    r.file_bytes += (r.bytes.back() + page - 1) / page * page;
  }
  return r;
}

int optimizer_fields(torch::optim::Optimizer& o) {
  const auto& options = o.param_groups().at(0).options();
  if (dynamic_cast<torch::optim::Adam*>(&o) != nullptr)
    return static_cast<const torch::optim::AdamOptions&>(options).amsgrad() ? 3 : 2;
  if (dynamic_cast<torch::optim::AdamW*>(&o) != nullptr)
    return static_cast<const torch::optim::AdamWOptions&>(options).amsgrad() ? 3 : 2;
  if (dynamic_cast<torch::optim::SGD*>(&o) != nullptr)
    return static_cast<const torch::optim::SGDOptions&>(options).momentum() != 0 ? 1 : 0;
  throw Error("parallel.offload: only sgd, adam and adamw state can be offloaded");
}

int64_t available_bytes(const std::string& dir) {
  // The directory is created later (by the first rank); its file system is its parent's.
  std::filesystem::path p = std::filesystem::absolute(dir);
  struct statvfs s {};
  while (::statvfs(p.c_str(), &s) != 0) {
    if (errno != ENOENT || !p.has_relative_path()) return -1;
    p = p.parent_path();
  }
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

void check_offload_room(const std::string& dir, int ranks, int64_t bytes_per_rank,
                        int64_t available) {
  const auto need =
      static_cast<int64_t>(std::ceil(static_cast<double>(ranks) * bytes_per_rank * 1.05));
  KRAB_CHECK_ARG(
      available >= need, "parallel.offload: disk needs ", need, " bytes in '", dir, "' (", ranks,
      " ranks x ", bytes_per_rank, " bytes, + 5%) but its file system has ",
      available < 0 ? std::string("no readable free space") : str_cat(available, " bytes free"));
}

// Every rank's file has the same size (the shards are equal), so each rank can check the room
// for all of them; the refusal is agreed on before anything is allocated.
std::unique_ptr<DiskOffload> open_offload(const std::string& dir, comm::Communicator& comm,
                                          const OffloadRegions& regions) {
  std::string refusal;
  try {
    check_offload_room(dir, comm.size(), regions.file_bytes, available_bytes(dir));
  } catch (const InvalidArgument& e) {
    refusal = e.what();
  }
  at::Tensor refused = torch::tensor({refusal.empty() ? 0.0f : 1.0f});
  comm.allreduce(refused, comm::ReduceOp::kMax)->wait();
  if (!refusal.empty()) throw InvalidArgument(refusal);
  KRAB_CHECK_ARG(refused.item<float>() == 0,
                 "parallel.offload: disk: another rank found no room for the offload files in '",
                 dir, "'");
  return std::make_unique<DiskOffload>(dir, comm.rank(), regions);
}

DiskOffload::DiskOffload(const std::string& dir, int rank, const OffloadRegions& regions,
                         const std::vector<at::Tensor>& shards, ShardOptimizers& optimizers)
    : DiskOffload(dir, rank, regions) {
  install_state(shards, optimizers);
}

DiskOffload::DiskOffload(const std::string& dir, int rank, const OffloadRegions& regions)
    : dir_(dir), path_(dir + "/rank-" + std::to_string(rank) + ".bin"), regions_(regions) {
  core::make_dirs(dir_);
  struct stat st {};
  if (::lstat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(str_cat("parallel.offload: '", dir_, "' is not a directory"));
  // A killed run's file: unlink removes the name (never a symlink's target); O_EXCL then
  // refuses whatever might appear at the path in between.
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT)
    throw Error(str_cat("cannot remove the stale offload file '", path_, "': ", why()));
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd_ < 0) throw Error(str_cat("cannot create the offload file '", path_, "': ", why()));
  const int64_t size = std::max<int64_t>(regions_.file_bytes, 1);  // mmap refuses 0 bytes
  // posix_fallocate returns the error rather than setting errno.
  if (const int err = ::posix_fallocate(fd_, 0, size); err != 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
    throw Error(str_cat("cannot allocate ", size, " bytes for the offload file '", path_,
                        "': ", std::strerror(err)));
  }
  base_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base_ == MAP_FAILED) {
    const std::string reason = why();
    ::close(fd_);
    ::unlink(path_.c_str());
    throw Error(str_cat("cannot map the offload file '", path_, "': ", reason));
  }
}

void DiskOffload::install_state(const std::vector<at::Tensor>& shards,
                                ShardOptimizers& optimizers) {
  for (int u = 0; u < static_cast<int>(shards.size()); ++u)
    if (regions_.numel[u] > 0)  // a unit of 0 elements is never stepped
      // The state LibTorch's step() would create on its first call, over the mapping: step()
      // then takes its "state exists" branch and updates the file in place.
      set_tensor_state(optimizers.at(u), shards[u],
                       {true, 0, field_views(static_cast<char*>(base_), regions_, u)});
}

at::Tensor DiskOffload::master(int unit) const {
  KRAB_CHECK(regions_.master, "DiskOffload: the file holds no master shards");
  return torch::from_blob(static_cast<char*>(base_) + regions_.offset.at(unit),
                          {regions_.numel[unit]}, torch::kFloat32);
}

void DiskOffload::prefetch_master(int unit) const {
  if (!regions_.master || regions_.numel.at(unit) == 0) return;
  ::madvise(static_cast<char*>(base_) + regions_.offset[unit], regions_.numel[unit] * 4,
            MADV_WILLNEED);
}

// The gather read the master through read faults, and a read fault maps more than the page it
// needs: the neighbouring pages already in the page cache ("fault-around") and whole large
// folios of it, i.e. possibly other units' masters or state whose write-back was still running
// when they were dropped. The process's mapping is therefore dropped whole (a walk of its page
// tables, cheap when little is mapped; a gather in flight for another unit only faults its
// pages in again), the page cache only over the master itself (another unit's pages may be
// about to be read by its own gather).
void DiskOffload::release_master(int unit) const {
  if (!regions_.master || regions_.numel.at(unit) == 0) return;
  char* first = static_cast<char*>(base_) + regions_.offset[unit];
  ::msync(first, regions_.numel[unit] * 4, MS_ASYNC);
  ::madvise(base_, regions_.file_bytes, MADV_DONTNEED);
  ::posix_fadvise(fd_, regions_.offset[unit], regions_.numel[unit] * 4, POSIX_FADV_DONTNEED);
}

void DiskOffload::release_all() const { release_range(0, regions_.file_bytes); }

DiskOffload::~DiskOffload() {
  ::munmap(base_, std::max<int64_t>(regions_.file_bytes, 1));
  ::close(fd_);
  ::unlink(path_.c_str());
  ::rmdir(dir_.c_str());  // fails, harmlessly, while other ranks' files are still there
}

void DiskOffload::advise(int unit, int advice) const {
  if (regions_.bytes[unit] == 0) return;
  ::madvise(static_cast<char*>(base_) + regions_.offset[unit], regions_.bytes[unit], advice);
}

// Dropping the pages of a MAP_SHARED mapping hands dirty ones to the page cache, which writes
// them back; fadvise then lets the kernel drop them from the cache too once they are clean, so
// neither this process's RSS nor its cgroup's page cache holds more than the window.
void DiskOffload::release(int unit) const {
  release_range(regions_.offset[unit], regions_.bytes[unit]);
}

// `offset` is page-aligned (a region's start); the end need not be: madvise rounds the length
// up, which may drop the first page of the next field too — harmless for a shared mapping,
// whose pages are the file's.
void DiskOffload::release_range(int64_t offset, int64_t bytes) const {
  if (bytes == 0) return;
  char* begin = static_cast<char*>(base_) + offset;
  ::msync(begin, bytes, MS_ASYNC);
  ::madvise(begin, bytes, MADV_DONTNEED);
  ::posix_fadvise(fd_, offset, bytes, POSIX_FADV_DONTNEED);
}

void DiskOffload::step(ShardOptimizers& optimizers, double lr) {
  const int units = optimizers.size();
  if (units > 0) advise(0, MADV_WILLNEED);
  for (int u = 0; u < units; ++u) {
    if (u + 1 < units) advise(u + 1, MADV_WILLNEED);
    optimizers.step_unit(u, lr);
    release(u);
  }
  // A read fault on a file mapping also maps the neighbouring pages already in the page cache
  // ("fault-around", up to 64 KiB), which can bring back units released before; one pass over
  // the whole mapping leaves none of it in this process between steps.
  if (regions_.file_bytes > 0) ::madvise(base_, regions_.file_bytes, MADV_DONTNEED);
}

}  // namespace krab::parallel::zero
