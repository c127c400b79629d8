#include "data/images.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <exception>
#include <optional>
#include <random>
#include <thread>

#include "core/errors.h"
#include "data/image_codec.h"
#include "data/rng.h"

namespace krab::data {
namespace {

// One per channel: a single value is repeated.
std::vector<float> per_channel(const std::vector<double>& v, int64_t channels, const char* key) {
  KRAB_CHECK_ARG(v.size() == 1 || static_cast<int64_t>(v.size()) == channels, key, " has ",
                 v.size(), " values but the images have ", channels,
                 " channels (give one value, or one per channel)");
  std::vector<float> out(channels);
  for (int64_t c = 0; c < channels; ++c) out[c] = static_cast<float>(v.size() == 1 ? v[0] : v[c]);
  return out;
}

// Runs fn(0) .. fn(n - 1) on `threads` threads (the calling one included), each taking the next
// index from a shared counter: the items are independent.
template <typename Fn>
void parallel_for(int64_t n, int64_t threads, Fn fn) {
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < std::min<int64_t>(threads, n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

struct Normalisation {
  std::vector<float> mean, std;
};

Normalisation checked_options(const ImageOptions& o, int64_t channels) {
  KRAB_CHECK_ARG(o.height >= 1 && o.width >= 1, "data.size must be set for data.name: images");
  KRAB_CHECK_ARG(o.threads >= 1, "data.decode_threads must be >= 1, got ", o.threads);
  Normalisation n{per_channel(o.mean, channels, "data.mean"),
                  per_channel(o.std, channels, "data.std")};
  for (float s : n.std) KRAB_CHECK_ARG(s > 0, "data.std must be > 0, got ", s);
  return n;
}

// One image as the model sees it: decoded, converted to `channels`, resized, normalised. The
// one place both the in-memory and the lazy split make their numbers.
at::Tensor decode_example(const std::string& file, const ImageOptions& o, int64_t channels,
                          const std::vector<float>& mean, const std::vector<float>& std) {
  at::Tensor x =
      image_to_tensor(decode_image_file(file, channels, o.max_pixels), o.height, o.width);
  for (int64_t c = 0; c < channels; ++c) x[c].sub_(mean[c]).div_(std[c]);
  return x;
}

// Runs `fn` and keeps what it throws: an unreadable file (InvalidArgument) as text for the
// caller to skip or name, anything else (out of memory) to be rethrown, since a background
// thread must not let an exception escape.
template <typename Fn>
void keep_errors(Fn fn, std::string& error, std::exception_ptr& fatal) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    error = e.what();
  } catch (...) {
    fatal = std::current_exception();
  }
}

InvalidArgument unreadable_error(const std::string& what) {
  return InvalidArgument(what + " (data.skip_bad: true skips such files)");
}

// First image's channel count (grey 1, colour 3): what the whole data set is converted to.
int64_t first_image_channels(const ImageFolder& folder, const ImageOptions& o) {
  for (const std::string& file : folder.files) {
    try {
      return decode_image_file(file, 0, o.max_pixels).channels;
    } catch (const InvalidArgument& e) {
      if (!o.skip_bad) throw unreadable_error(e.what());
    }
  }
  throw InvalidArgument(str_cat("image folder '", folder.root, "' holds no readable image"));
}

// The files of `folder` whose header check passes (probe_image_file, on `threads` threads);
// without skip_bad the first that fails, in example order, is named. `skipped` counts the rest.
ImageFolder checked_headers(ImageFolder folder, const ImageOptions& o, int64_t& skipped) {
  const int64_t n = static_cast<int64_t>(folder.files.size());
  std::vector<std::string> errors(n);
  std::vector<std::exception_ptr> fatal(n);
  parallel_for(n, o.threads, [&](int64_t i) {
    keep_errors([&] { probe_image_file(folder.files[i], o.max_pixels); }, errors[i], fatal[i]);
  });
  for (const std::exception_ptr& e : fatal)
    if (e) std::rethrow_exception(e);
  ImageFolder out{folder.root, folder.classes, {}, {}};
  for (int64_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) {
      if (!o.skip_bad) throw unreadable_error(errors[i]);
      ++skipped;
      continue;
    }
    out.files.push_back(std::move(folder.files[i]));
    out.labels.push_back(folder.labels[i]);
  }
  KRAB_CHECK_ARG(!out.files.empty(), "image folder '", folder.root, "' holds no readable image");
  return out;
}

}  // namespace

std::vector<double> parse_number_list(const std::string& text, const std::string& key) {
  std::string s = text;
  for (char& ch : s)
    if (ch == '[' || ch == ']' || ch == ',') ch = ' ';
  std::vector<double> out;
  size_t pos = 0;
  while (pos < s.size()) {
    if (std::isspace(static_cast<unsigned char>(s[pos]))) {
      ++pos;
      continue;
    }
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s.substr(pos), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KRAB_CHECK_ARG(used > 0 && std::isfinite(v), key, ": '", text,
                   "' is not a number or a comma-separated list of numbers");
    out.push_back(v);
    pos += used;
  }
  KRAB_CHECK_ARG(!out.empty(), key, " is empty; give one number or one per channel");
  return out;
}

std::pair<int64_t, int64_t> parse_image_size(const std::string& text) {
  std::string s = text;
  for (char& ch : s)
    if (ch == 'x' || ch == 'X') ch = ',';
  std::vector<double> v;
  try {
    v = parse_number_list(s, "data.size");
  } catch (const InvalidArgument&) {
    v.clear();
  }
  const bool ok = (v.size() == 1 || v.size() == 2) && std::all_of(v.begin(), v.end(), [](double d) {
                    return d >= 1 && d <= 65536 && d == std::floor(d);
                  });
  KRAB_CHECK_ARG(ok, "data.size: '", text,
                 "' is not an image size (write H,W or HxW, e.g. 28x28, or one number N for NxN)");
  return {static_cast<int64_t>(v[0]), static_cast<int64_t>(v.back())};
}

DecodedImages decode_image_folder(const ImageFolder& folder, const ImageOptions& o,
                                  int64_t channels) {
  const Normalisation norm = checked_options(o, channels);
  const int64_t n = static_cast<int64_t>(folder.files.size());
  at::Tensor all = torch::empty({n, channels, o.height, o.width}, torch::kFloat32);
  std::vector<std::string> errors(n);
  std::vector<std::exception_ptr> fatal(n);
  parallel_for(n, o.threads, [&](int64_t i) {
    keep_errors(
        [&] { all[i].copy_(decode_example(folder.files[i], o, channels, norm.mean, norm.std)); },
        errors[i], fatal[i]);
  });
  for (const std::exception_ptr& e : fatal)
    if (e) std::rethrow_exception(e);

  DecodedImages out;
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < n; ++i) {
    if (errors[i].empty()) {
      keep.push_back(i);
      continue;
    }
    if (!o.skip_bad) throw unreadable_error(errors[i]);
    if (out.skipped++ == 0) out.first_skipped = errors[i];
  }
  KRAB_CHECK_ARG(!keep.empty(), "image folder '", folder.root, "' holds no readable image");
  auto labels = torch::tensor(folder.labels, torch::kInt64);
  if (out.skipped == 0) {
    out.data = {all, labels};
  } else {
    auto idx = torch::tensor(keep, torch::kInt64);
    out.data = {all.index_select(0, idx), labels.index_select(0, idx)};
  }
  return out;
}

DataSplits load_images(const std::string& root, const ImageOptions& o, int64_t* skipped) {
  KRAB_CHECK_ARG(o.height >= 1 && o.width >= 1, "data.size must be set for data.name: images");
  KRAB_CHECK_ARG(o.threads >= 1, "data.decode_threads must be >= 1, got ", o.threads);
  KRAB_CHECK_ARG(o.max_pixels >= 1, "data.max_pixels must be >= 1, got ", o.max_pixels);
  int64_t skipped_total = 0;
  ImageFolder train = scan_image_folder(root);
  if (o.lazy) train = checked_headers(std::move(train), o, skipped_total);
  const int64_t channels = o.channels != 0 ? o.channels : first_image_channels(train, o);
  DataSplits splits;
  if (o.lazy) {
    splits.lazy_train = std::make_shared<ImageFolderDataset>(train, o, channels);
  } else {
    DecodedImages decoded = decode_image_folder(train, o, channels);
    skipped_total += decoded.skipped;
    splits.train = std::move(decoded.data);
  }
  if (!o.test_path.empty() && o.lazy) {
    ImageFolder test =
        checked_headers(scan_image_folder(o.test_path, train.classes), o, skipped_total);
    ImageOptions uncached = o;
    uncached.cache_mb = 0;  // read once per evaluation, in order: a cache would only hold memory
    splits.lazy_test =
        std::make_shared<ImageFolderDataset>(std::move(test), uncached, channels, o.threads);
  } else if (!o.test_path.empty()) {
    DecodedImages test =
        decode_image_folder(scan_image_folder(o.test_path, train.classes), o, channels);
    skipped_total += test.skipped;
    splits.test = std::move(test.data);
  }
  splits.input_shape = {channels, o.height, o.width};
  splits.num_classes = static_cast<int64_t>(train.classes.size());
  splits.language_model = false;
  if (skipped != nullptr) *skipped = skipped_total;
  return splits;
}

void augment_images(at::Tensor& x, const std::vector<int64_t>& idx, uint64_t seed, int64_t epoch,
                    const ImageOptions& o) {
  if (o.random_crop <= 0 && !o.random_flip) return;
  KRAB_CHECK(x.dim() == 4 && x.size(0) == static_cast<int64_t>(idx.size()),
             "augment_images: batch and indices disagree");
  const int64_t pad = o.random_crop, h = x.size(2), w = x.size(3);
  const at::Tensor padded = pad > 0 ? torch::constant_pad_nd(x, {pad, pad, pad, pad}, 0) : x;
  const uint64_t epoch_seed = derive_seed(seed, static_cast<uint64_t>(epoch));
  for (size_t r = 0; r < idx.size(); ++r) {
    std::mt19937_64 rng(derive_seed(epoch_seed, static_cast<uint64_t>(idx[r])));
    at::Tensor img = padded[r];
    if (pad > 0) {
      const int64_t dy = static_cast<int64_t>(uniform_below(rng, 2 * pad + 1));
      const int64_t dx = static_cast<int64_t>(uniform_below(rng, 2 * pad + 1));
      img = img.narrow(1, dy, h).narrow(2, dx, w);
    }
    const bool flip = o.random_flip && uniform_below(rng, 2) == 1;
    if (flip) img = img.flip({2});
    if (pad > 0 || flip) x[r].copy_(img);
  }
}

ImageFolderDataset::ImageFolderDataset(ImageFolder folder, ImageOptions options, int64_t channels,
                                       int64_t get_threads)
    : folder_(std::move(folder)),
      options_(std::move(options)),
      channels_(channels),
      get_threads_(std::max<int64_t>(1, get_threads)) {
  const Normalisation norm = checked_options(options_, channels_);
  mean_ = norm.mean;
  std_ = norm.std;
  entry_bytes_ = channels_ * options_.height * options_.width * static_cast<int64_t>(sizeof(float));
  capacity_ = std::max<int64_t>(options_.cache_mb, 0) * (int64_t{1} << 20) / entry_bytes_;
}

int64_t ImageFolderDataset::resident_bytes() const {
  return std::min(capacity_, size()) * entry_bytes_;
}

at::Tensor ImageFolderDataset::targets() const {
  return torch::tensor(folder_.labels, torch::kInt64);
}

int64_t ImageFolderDataset::replaced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(replaced_.size());
}

int64_t ImageFolderDataset::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(cache_.size()) * entry_bytes_;
}

at::Tensor ImageFolderDataset::load(int64_t i, std::string& error) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(i); it != cache_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second.second);
      return it->second.first;
    }
  }
  // Decoded outside the lock; two threads that want the same image both decode it (rare, and
  // both get the same numbers).
  at::Tensor x;
  std::exception_ptr fatal;
  keep_errors([&] { x = decode_example(folder_.files[i], options_, channels_, mean_, std_); },
              error, fatal);
  if (fatal) std::rethrow_exception(fatal);
  if (!x.defined() || capacity_ == 0) return x;
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.count(i) == 0) {
    recent_.push_front(i);
    cache_.emplace(i, std::make_pair(x, recent_.begin()));
    while (static_cast<int64_t>(cache_.size()) > capacity_) {
      cache_.erase(recent_.back());
      recent_.pop_back();
    }
  }
  return x;
}

// The first example after `bad`, cyclically, that decodes; every unreadable one passed on the
// way is replaced by it too (it is their first readable successor as well).
int64_t ImageFolderDataset::replacement(int64_t bad, const std::string& error) const {
  std::vector<std::pair<int64_t, std::string>> found{{bad, error}};
  for (int64_t k = 1; k < size(); ++k) {
    const int64_t j = (bad + k) % size();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (replaced_.count(j) != 0) continue;
    }
    std::string why;
    if (!load(j, why).defined()) {
      found.emplace_back(j, why);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [i, text] : found) {
      if (!replaced_.emplace(i, j).second || !options_.note) continue;
      options_.note(str_cat(text, "; example ", i, " uses '", folder_.files[j], "' instead"));
    }
    return j;
  }
  throw InvalidArgument(str_cat("image folder '", folder_.root, "' holds no readable image"));
}

std::pair<at::Tensor, int64_t> ImageFolderDataset::example(int64_t i) const {
  KRAB_CHECK_ARG(i >= 0 && i < size(), "image example ", i, " is out of range [0, ", size(), ")");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = replaced_.find(i); it != replaced_.end()) i = it->second;
  }
  std::string error;
  at::Tensor x = load(i, error);
  if (x.defined()) return {x, folder_.labels[i]};
  if (!options_.skip_bad) throw unreadable_error(error);
  const int64_t j = replacement(i, error);
  std::string why;
  at::Tensor y = load(j, why);
  if (!y.defined()) throw unreadable_error(why);  // readable a moment ago: the file changed
  return {y, folder_.labels[j]};
}

std::pair<at::Tensor, at::Tensor> ImageFolderDataset::get(const std::vector<int64_t>& idx) const {
  const int64_t n = static_cast<int64_t>(idx.size());
  at::Tensor x = torch::empty({n, channels_, options_.height, options_.width}, torch::kFloat32);
  at::Tensor y = torch::empty({n}, torch::kInt64);
  int64_t* labels = y.data_ptr<int64_t>();
  // Each row is written by one thread; the first failure (an unreadable file, in order of the
  // rows) is rethrown on the caller's thread.
  std::vector<std::exception_ptr> failed(n);
  parallel_for(n, get_threads_, [&](int64_t r) {
    try {
      auto [image, label] = example(idx[r]);
      x[r].copy_(image);
      labels[r] = label;
    } catch (...) {
      failed[r] = std::current_exception();
    }
  });
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
  return {x, y};
}

std::unique_ptr<BatchPrefetcher> prefetch_image_batches(std::shared_ptr<const Dataset> train,
                                                        const GlobalBatchSampler& sampler,
                                                        const ImageOptions& o, uint64_t seed,
                                                        int64_t end_step) {
  KRAB_CHECK_ARG(o.threads >= 1, "data.decode_threads must be >= 1, got ", o.threads);
  // The prefetcher's own copy: it is called on the training thread only (Plan), like the
  // trainer's, but caches its own epoch's permutation.
  auto plan_sampler = std::make_shared<GlobalBatchSampler>(sampler);
  auto plan = [plan_sampler](int64_t step, BatchSlice part) {
    return plan_sampler->slice(step, part);
  };
  // Runs on the prefetcher's threads: get (decoding, for a lazy folder) and augment, both
  // thread-safe; the epoch is steps_per_epoch arithmetic, which needs no sampler state.
  const int64_t per_epoch = sampler.steps_per_epoch();
  auto produce = [train, o, seed, per_epoch](int64_t step, const std::vector<int64_t>& idx) {
    auto batch = train->get(idx);
    augment_images(batch.first, idx, seed, step / per_epoch, o);
    return batch;
  };
  const int threads = static_cast<int>(o.threads);
  return std::make_unique<BatchPrefetcher>(plan, produce, threads, 2 * threads, end_step);
}

}  // namespace krab::data
