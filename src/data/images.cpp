#include "data/images.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <exception>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/errors.h"
#include "data/image_codec.h"
#include "data/rng.h"

namespace krab::data {
namespace {

namespace fs = std::filesystem;

bool is_image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

bool hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }

// Sorted names of the entries of `dir` that pass `keep`.
template <typename Keep>
std::vector<std::string> sorted_entries(const fs::path& dir, Keep keep) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (!hidden(e.path()) && keep(e)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void check_root(const std::string& root) {
  std::error_code ec;
  KRAB_CHECK_ARG(fs::exists(root, ec), "image folder '", root, "' does not exist");
  KRAB_CHECK_ARG(fs::is_directory(root, ec), "image folder '", root,
                 "' is a file, not a directory (it should hold one folder per class)");
}

// One per channel: a single value is repeated.
std::vector<float> per_channel(const std::vector<double>& v, int64_t channels, const char* key) {
  KRAB_CHECK_ARG(v.size() == 1 || static_cast<int64_t>(v.size()) == channels, key, " has ",
                 v.size(), " values but the images have ", channels,
                 " channels (give one value, or one per channel)");
  std::vector<float> out(channels);
  for (int64_t c = 0; c < channels; ++c) out[c] = static_cast<float>(v.size() == 1 ? v[0] : v[c]);
  return out;
}

// Decodes folder.files[i] into dst[i], normalised. An unreadable file is kept (as text) for
// the caller to skip or name; anything else (out of memory) is kept to be rethrown, since a
// background thread must not let an exception escape.
void decode_into(const ImageFolder& folder, int64_t i, const ImageOptions& o, int64_t channels,
                 const std::vector<float>& mean, const std::vector<float>& std, at::Tensor& dst,
                 std::string& error, std::exception_ptr& fatal) {
  try {
    at::Tensor x = image_to_tensor(decode_image_file(folder.files[i], channels), o.height, o.width);
    for (int64_t c = 0; c < channels; ++c) x[c].sub_(mean[c]).div_(std[c]);
    dst[i].copy_(x);
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
int64_t first_image_channels(const ImageFolder& folder, bool skip_bad) {
  for (const std::string& file : folder.files) {
    try {
      return decode_image_file(file).channels;
    } catch (const InvalidArgument& e) {
      if (!skip_bad) throw unreadable_error(e.what());
    }
  }
  throw InvalidArgument(str_cat("image folder '", folder.root, "' holds no readable image"));
}

}  // namespace

ImageFolder scan_image_folder(const std::string& root, const std::vector<std::string>& classes) {
  check_root(root);
  ImageFolder out;
  out.root = root;
  const std::vector<std::string> folders =
      sorted_entries(root, [](const fs::directory_entry& e) { return e.is_directory(); });
  KRAB_CHECK_ARG(!folders.empty(), "image folder '", root,
                 "' has no class folders (expected ROOT/<class>/<image>.png|jpg)");
  out.classes = classes.empty() ? folders : classes;
  for (const std::string& name : folders) {
    const auto at = std::find(out.classes.begin(), out.classes.end(), name);
    KRAB_CHECK_ARG(at != out.classes.end(), "image folder '", root, "': class folder '", name,
                   "' is not one of the training classes");
    const fs::path dir = fs::path(root) / name;
    const std::vector<std::string> files = sorted_entries(dir, [](const fs::directory_entry& e) {
      return e.is_regular_file() && is_image_name(e.path());
    });
    KRAB_CHECK_ARG(!files.empty(), "class folder '", dir.string(),
                   "' holds no .png, .jpg or .jpeg file");
    for (const std::string& f : files) {
      out.files.push_back((dir / f).string());
      out.labels.push_back(at - out.classes.begin());
    }
  }
  return out;
}

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
  KRAB_CHECK_ARG(o.height >= 1 && o.width >= 1, "data.size must be set for data.name: images");
  KRAB_CHECK_ARG(o.threads >= 1, "data.decode_threads must be >= 1, got ", o.threads);
  const std::vector<float> mean = per_channel(o.mean, channels, "data.mean");
  const std::vector<float> std = per_channel(o.std, channels, "data.std");
  for (float s : std) KRAB_CHECK_ARG(s > 0, "data.std must be > 0, got ", s);
  const int64_t n = static_cast<int64_t>(folder.files.size());
  at::Tensor all = torch::empty({n, channels, o.height, o.width}, torch::kFloat32);
  std::vector<std::string> errors(n);
  std::vector<std::exception_ptr> fatal(n);
  // Images are independent: threads take the next index from a shared counter.
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++)
      decode_into(folder, i, o, channels, mean, std, all, errors[i], fatal[i]);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < std::min<int64_t>(o.threads, n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
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
  const ImageFolder train = scan_image_folder(root);
  const int64_t channels = o.channels != 0 ? o.channels : first_image_channels(train, o.skip_bad);
  DecodedImages decoded = decode_image_folder(train, o, channels);
  int64_t skipped_total = decoded.skipped;
  DataSplits splits;
  splits.train = std::move(decoded.data);
  if (!o.test_path.empty()) {
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

}  // namespace krab::data
