// data.name: tensors — the loader of dataset.h's load_tensors.
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/shards.h"
#include "data/tensor_file.h"

namespace krab::data {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The tensor files `path` (the value of `key`) names: itself, or a directory's *.pt and *.pth
// files sorted by name (byte order, the same on every machine).
std::vector<std::string> tensor_files(const std::string& path, const char* key) {
  namespace fs = std::filesystem;
  KRAB_CHECK_ARG(!path.empty(), key,
                 " is empty: data.name 'tensors' needs a file written by torch.save({'x': X, "
                 "'y': Y}, FILE) or a directory of such files");
  KRAB_CHECK_ARG(fs::exists(path), key, ": '", path, "' does not exist");
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    const fs::path& p = entry.path();
    if (entry.is_regular_file() && p.filename().string()[0] != '.' &&
        (p.extension() == ".pt" || p.extension() == ".pth"))
      files.push_back(p.string());
  }
  std::sort(files.begin(), files.end());
  KRAB_CHECK_ARG(!files.empty(), key, ": directory '", path,
                 "' holds no .pt or .pth files (the shards of a tensors data set)");
  return files;
}

std::string kind_of(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  return str_cat(dtype, " ", c10::IntArrayRef(shape));
}

// Every file must hold examples of the first training file's kind; integer targets of any
// width are one kind (all are read as int64).
void check_same_kind(const TensorFileInfo& info, const std::string& file,
                     const TensorFileInfo& first, const std::string& first_file) {
  KRAB_CHECK_ARG(info.x_shape == first.x_shape && info.x_dtype == first.x_dtype, file, ": x holds ",
                 kind_of(info.x_shape, info.x_dtype), " per example but ", first_file, " holds ",
                 kind_of(first.x_shape, first.x_dtype));
  const bool same_y_dtype = integer_targets(info.y_dtype) ? integer_targets(first.y_dtype)
                                                          : info.y_dtype == first.y_dtype;
  KRAB_CHECK_ARG(info.y_shape == first.y_shape && same_y_dtype, file, ": y holds ",
                 kind_of(info.y_shape, info.y_dtype), " per example but ", first_file, " holds ",
                 kind_of(first.y_shape, first.y_dtype));
}

// The largest class label of `file` (-1 when it has none); a negative label is refused.
int64_t largest_label(const at::Tensor& labels, const std::string& file) {
  if (labels.numel() == 0) return -1;
  const at::Tensor as_long = labels.to(at::kLong);
  const int64_t low = as_long.min().item<int64_t>();
  KRAB_CHECK_ARG(low >= 0, file, ": label ", low, " out of range; class labels must be >= 0");
  return as_long.max().item<int64_t>();
}

void check_below(int64_t largest, int64_t num_classes, const std::string& file, const char* why) {
  KRAB_CHECK_ARG(largest < num_classes, file, ": label ", largest, " out of range [0, ",
                 num_classes, ") ", why);
}

struct Indexed {
  std::vector<std::string> files;
  std::vector<TensorFileInfo> infos;
  std::vector<int64_t> largest;  // per file, for integer targets
};

// Headers and labels of every file `path` names, checked against `first` (the first training
// file; null while indexing the training files themselves).
Indexed index_files(const std::string& path, const char* key, const Indexed* train) {
  Indexed out;
  out.files = tensor_files(path, key);
  for (const std::string& file : out.files) {
    TensorFileInfo info = inspect_tensor_file(file, /*with_labels=*/true);
    const Indexed& ref = train != nullptr ? *train : out;
    if (!ref.infos.empty()) check_same_kind(info, file, ref.infos.front(), ref.files.front());
    out.largest.push_back(integer_targets(info.y_dtype) ? largest_label(info.labels, file) : -1);
    info.labels = at::Tensor();  // labels are not kept: a shard's are reread with its examples
    out.infos.push_back(std::move(info));
  }
  return out;
}

// With data.num_classes 0 the classes come from the largest label, and that number sizes the
// model's output layer: one label of 2*10^7 in a 10 KB file made a 2*10^7-wide layer (6.6 GB
// before it was killed). Past kMaxInferredClasses the number must be given, not inferred.
void check_inferable(const Indexed& train) {
  for (size_t i = 0; i < train.files.size(); ++i)
    KRAB_CHECK_ARG(train.largest[i] < kMaxInferredClasses, train.files[i], ": label ",
                   train.largest[i], " would make ", train.largest[i] + 1,
                   " classes, more than krab infers from labels (", kMaxInferredClasses,
                   "); set data.num_classes if the data really has that many");
}

TensorDataset read_all(const std::vector<std::string>& files) {
  if (files.size() == 1) return read_tensor_file(files.front());
  std::vector<at::Tensor> xs, ys;
  for (const std::string& file : files) {
    TensorDataset part = read_tensor_file(file);
    xs.push_back(part.inputs);
    ys.push_back(part.targets);
  }
  return TensorDataset(torch::cat(xs), torch::cat(ys));
}

}  // namespace

DataSplits load_tensors(const std::string& path, const TensorsOptions& options) {
  const Indexed train = index_files(path, "data.path", nullptr);
  const TensorFileInfo& first = train.infos.front();
  int64_t examples = 0, largest_bytes = 1;
  for (const TensorFileInfo& info : train.infos) {
    examples += info.examples;
    largest_bytes = std::max(largest_bytes, info.bytes);
  }
  KRAB_CHECK_ARG(examples > 0, "data.path: '", path, "' holds no examples");

  DataSplits d;
  d.input_shape = first.x_shape;
  const bool classes = integer_targets(first.y_dtype);
  const int64_t largest = *std::max_element(train.largest.begin(), train.largest.end());
  if (classes) {
    if (options.num_classes == 0) check_inferable(train);
    d.num_classes =
        options.num_classes > 0 ? options.num_classes : std::max<int64_t>(2, largest + 1);
    for (size_t i = 0; i < train.files.size(); ++i)
      check_below(train.largest[i], d.num_classes, train.files[i], "(data.num_classes)");
  } else {
    d.num_classes = 1;
    for (const int64_t n : first.y_shape) d.num_classes *= n;
  }

  if (options.lazy && std::filesystem::is_directory(path)) {
    const int64_t cache_bytes = options.cache_mb * kMiB;
    const int64_t window = options.shuffle_window > 0
                               ? options.shuffle_window
                               : std::max<int64_t>(1, cache_bytes / largest_bytes);
    d.lazy_train =
        std::make_shared<ShardedDataset>(train.files, train.infos, cache_bytes, window, largest);
  } else {
    d.train = read_all(train.files);
  }

  if (!options.test_path.empty()) {
    const Indexed test = index_files(options.test_path, "data.test_path", &train);
    if (classes)
      for (size_t i = 0; i < test.files.size(); ++i)
        check_below(
            test.largest[i], d.num_classes, test.files[i],
            options.num_classes > 0 ? "(data.num_classes)" : "(the largest training label + 1)");
    if (options.lazy && std::filesystem::is_directory(options.test_path)) {
      int64_t largest_test = 1;
      for (const TensorFileInfo& info : test.infos)
        largest_test = std::max(largest_test, info.bytes);
      const int64_t labels =
          classes ? *std::max_element(test.largest.begin(), test.largest.end()) : -1;
      d.lazy_test =
          std::make_shared<ShardedDataset>(test.files, test.infos, largest_test, 1, labels);
    } else {
      d.test = read_all(test.files);
    }
  }
  return d;
}

}  // namespace krab::data
