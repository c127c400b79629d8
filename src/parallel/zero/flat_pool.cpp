#include "parallel/zero/flat_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace krab::parallel::zero {

struct FlatPool::State {
  std::mutex mu;
  bool open = true;  // false once the FlatPool is destroyed: freed blocks are unmapped
  std::vector<std::pair<void*, size_t>> kept;  // oldest first
  int64_t in_use = 0, kept_bytes = 0, peak_in_use = 0, mappings = 0;

  // Called with `mu` held; unmaps kept blocks, oldest first, while in_use + kept > peak.
  void shrink_to_bound() {
    size_t drop = 0;
    while (drop < kept.size() && in_use + kept_bytes > peak_in_use) {
      ::munmap(kept[drop].first, kept[drop].second);
      kept_bytes -= static_cast<int64_t>(kept[drop].second);
      ++drop;
    }
    kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(drop));
  }
};

namespace {

// What a handed-out block's DataPtr carries: its mapping and the pool to return it to.
struct Block {
  void* ptr;
  size_t bytes;
  std::shared_ptr<FlatPool::State> state;
};

size_t whole_pages(size_t bytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// The DataPtr's deleter: a freed block goes back to its pool, or is unmapped when the pool is
// gone. Keeping it cannot break the bound: in_use drops by what kept grows.
void give_back(void* context) {
  std::unique_ptr<Block> block(static_cast<Block*>(context));
  FlatPool::State& s = *block->state;
  std::lock_guard<std::mutex> lock(s.mu);
  s.in_use -= static_cast<int64_t>(block->bytes);
  if (s.open) {
    s.kept.emplace_back(block->ptr, block->bytes);
    s.kept_bytes += static_cast<int64_t>(block->bytes);
  } else {
    ::munmap(block->ptr, block->bytes);
  }
}

}  // namespace

FlatPool::FlatPool(size_t block_bytes)
    : block_bytes_(block_bytes), state_(std::make_shared<State>()) {}

FlatPool::~FlatPool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->open = false;
  for (const auto& [ptr, bytes] : state_->kept) ::munmap(ptr, bytes);
  state_->kept.clear();
  state_->kept_bytes = 0;
}

c10::DataPtr FlatPool::allocate(size_t bytes) const {
  if (bytes == 0) return {nullptr, c10::Device(c10::DeviceType::CPU)};
  const size_t size = whole_pages(std::max(bytes, block_bytes_));
  auto block = std::make_unique<Block>(Block{nullptr, size, state_});  // before a mapping exists
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  void*& ptr = block->ptr;
  // The most recently kept block of this size: its pages are the likeliest still in cache.
  const auto hit = std::find_if(s.kept.rbegin(), s.kept.rend(),
                                [size](const auto& k) { return k.second == size; });
  if (hit != s.kept.rend()) {
    ptr = hit->first;
    s.kept.erase(std::next(hit).base());
    s.kept_bytes -= static_cast<int64_t>(size);
  } else {
    ptr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) throw std::bad_alloc();
    ++s.mappings;
  }
  s.in_use += static_cast<int64_t>(size);
  s.peak_in_use = std::max(s.peak_in_use, s.in_use);
  s.shrink_to_bound();
  return {ptr, block.release(), &give_back, c10::Device(c10::DeviceType::CPU)};
}

int64_t FlatPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->in_use;
}

int64_t FlatPool::kept_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->kept_bytes;
}

int64_t FlatPool::peak_in_use_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->peak_in_use;
}

int64_t FlatPool::mappings() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->mappings;
}

void FlatPool::release_kept() {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (const auto& [ptr, bytes] : state_->kept) ::munmap(ptr, bytes);
  state_->kept.clear();
  state_->kept_bytes = 0;
}

}  // namespace krab::parallel::zero
