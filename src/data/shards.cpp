#include "data/shards.h"

#include <torch/torch.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/errors.h"

namespace krab::data {
namespace {

// Bytes as MiB with two decimals, for messages.
std::string mib(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return out.str();
}

std::vector<int64_t> shape_with(int64_t n, const std::vector<int64_t>& rest) {
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), rest.begin(), rest.end());
  return shape;
}

}  // namespace

ShardedDataset::ShardedDataset(std::vector<std::string> files, std::vector<TensorFileInfo> infos,
                               int64_t cache_bytes, int64_t window, int64_t largest_label)
    : files_(std::move(files)),
      infos_(std::move(infos)),
      cache_bytes_(cache_bytes),
      window_(window),
      largest_label_(largest_label) {
  KRAB_CHECK(!files_.empty() && files_.size() == infos_.size() && window_ >= 1);
  int64_t largest = 0;
  for (size_t s = 0; s < files_.size(); ++s) {
    starts_.push_back(size_);
    size_ += infos_[s].examples;
    largest = std::max(largest, infos_[s].bytes);
    KRAB_CHECK_ARG(infos_[s].bytes <= cache_bytes_, files_[s], ": this shard's ",
                   mib(infos_[s].bytes), " do not fit in data.cache_mb (", mib(cache_bytes_),
                   "); raise data.cache_mb or write smaller shards");
  }
  starts_.push_back(size_);
  const int64_t shards = static_cast<int64_t>(files_.size());
  KRAB_CHECK_ARG(std::min(window_, shards) * largest <= cache_bytes_, "data.shuffle_window ",
                 window_, ": that many shards of up to ", mib(largest),
                 " do not fit in data.cache_mb (", mib(cache_bytes_),
                 "), so every window would be read more than once; lower it, or set it to 0 "
                 "(as many as fit)");
}

int64_t ShardedDataset::resident_bytes() const {
  int64_t total = 0;
  for (const TensorFileInfo& info : infos_) total += info.bytes;
  return std::min(total, cache_bytes_);
}

ShardLayout ShardedDataset::layout() const {
  ShardLayout layout;
  for (const TensorFileInfo& info : infos_) layout.shard_sizes.push_back(info.examples);
  layout.window = window_;
  return layout;
}

int64_t ShardedDataset::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

int64_t ShardedDataset::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

int64_t ShardedDataset::shard_of(int64_t index) const {
  KRAB_CHECK_ARG(index >= 0 && index < size_, "example ", index, " outside the data set of ", size_,
                 " examples");
  return static_cast<int64_t>(std::upper_bound(starts_.begin(), starts_.end(), index) -
                              starts_.begin()) -
         1;
}

const TensorDataset& ShardedDataset::shard(int64_t s) const {
  if (auto it = cache_.find(s); it != cache_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
    return it->second.data;
  }
  // Make room before reading, so that the cache and the shard being read never hold more than
  // cache_bytes together (the constructor checked that one shard fits).
  const TensorFileInfo& info = infos_[s];
  bool evicted = false;
  while (!lru_.empty() && cached_bytes_ + info.bytes > cache_bytes_) {
    const int64_t victim = lru_.back();
    cached_bytes_ -= infos_[victim].bytes;
    cache_.erase(victim);
    lru_.pop_back();
    evicted = true;
  }
#ifdef __GLIBC__
  // Hand the evicted shards' pages back to the system now. glibc raises its mmap threshold to
  // the largest block freed, so after the first eviction shards live in its heap, where a freed
  // one stays resident until a later shard reuses the place: a worker measured one shard over
  // its cache (tests/data/shards_memory_e2e_test.cpp). malloc_trim releases the free pages
  // inside the heap too; once per shard read, it costs little beside the read.
  if (evicted) ::malloc_trim(0);
#endif
  TensorDataset data = read_tensor_file(files_[s]);
  ++loads_;
  const auto sizes = data.inputs.sizes();
  if (data.size() != info.examples ||
      std::vector<int64_t>(sizes.begin() + 1, sizes.end()) != info.x_shape ||
      data.inputs.scalar_type() != info.x_dtype)
    throw CorruptData(str_cat(files_[s], ": the shard changed since the data set was opened (",
                              info.examples, " examples expected, ", data.size(), " read)"));
  lru_.push_front(s);
  cached_bytes_ += info.bytes;
  return cache_.emplace(s, Entry{std::move(data), lru_.begin()}).first->second.data;
}

std::pair<at::Tensor, at::Tensor> ShardedDataset::get(const std::vector<int64_t>& idx) const {
  const int64_t n = static_cast<int64_t>(idx.size());
  const TensorFileInfo& first = infos_.front();
  const at::ScalarType y_dtype = integer_targets(first.y_dtype) ? at::kLong : first.y_dtype;
  at::Tensor x = at::empty(shape_with(n, first.x_shape), at::TensorOptions(first.x_dtype));
  at::Tensor y = at::empty(shape_with(n, first.y_shape), at::TensorOptions(y_dtype));
  // Positions in the batch and rows in the shard, per shard.
  std::map<int64_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> wanted;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = shard_of(idx[i]);
    wanted[s].first.push_back(i);
    wanted[s].second.push_back(idx[i] - starts_[s]);
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> order;
  for (const auto& [s, unused] : wanted) order.push_back(s);
  std::stable_partition(order.begin(), order.end(), [&](int64_t s) { return cache_.count(s) > 0; });
  for (const int64_t s : order) {
    auto& [positions, rows] = wanted[s];
    const TensorDataset& data = shard(s);
    auto [sx, sy] = data.get(rows);
    const at::Tensor at_positions = torch::tensor(positions, torch::kInt64);
    x.index_copy_(0, at_positions, sx);
    y.index_copy_(0, at_positions, sy);
  }
  return {x, y};
}

}  // namespace krab::data
