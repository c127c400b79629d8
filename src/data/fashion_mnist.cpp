#include <torch/torch.h>

#include <filesystem>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/idx.h"

namespace krab::data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kClasses = 10;
// Mean and standard deviation of the 60k training pixels scaled to [0, 1] (computed once from
// the Debian files: 0.28604, 0.35302). The test split is standardised with the training
// statistics, as it must be.
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

// The gzipped name is what the Debian package installs; the plain name is what users get after
// gunzip. zlib reads either, so this only picks which one exists.
std::string find_file(const fs::path& dir, const std::string& stem) {
  const fs::path gz = dir / (stem + ".gz");
  if (fs::is_regular_file(gz)) return gz.string();
  const fs::path plain = dir / stem;
  if (fs::is_regular_file(plain)) return plain.string();
  throw InvalidArgument(
      str_cat("Fashion-MNIST file '", gz.string(), "' (or '", plain.string(), "') does not exist"));
}

TensorDataset load_split(const fs::path& dir, const std::string& prefix, bool normalize) {
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  at::Tensor images = read_idx(images_path, kIdxImagesMagic);
  at::Tensor labels = read_idx(labels_path, kIdxLabelsMagic);

  if (images.size(0) != labels.size(0)) {
    throw CorruptData(str_cat("'", labels_path, "' holds ", labels.size(0), " labels but '",
                              images_path, "' holds ", images.size(0), " images"));
  }
  const int64_t max_label = labels.max().item<uint8_t>();
  if (max_label >= kClasses) {
    const int64_t at = labels.argmax().item<int64_t>();
    throw CorruptData(str_cat("'", labels_path, "': label ", max_label, " at index ", at,
                              " is out of range [0, ", kClasses, ")"));
  }

  TensorDataset out;
  out.inputs = images.unsqueeze(1).to(torch::kFloat32).div_(255.0);
  if (normalize) out.inputs.sub_(kMean).div_(kStd);
  out.targets = labels.to(torch::kInt64);
  return out;
}

// data.path must name the directory that holds the four files; a file there is a common slip
// (the path of one of them), and "does not exist" would be wrong about it.
void check_directory(const std::string& dir) {
  std::error_code ec;
  KRAB_CHECK_ARG(fs::exists(dir, ec), "dataset directory '", dir, "' does not exist");
  KRAB_CHECK_ARG(fs::is_directory(dir, ec), "dataset directory '", dir,
                 "' is a file, not a directory (data.path names the directory that holds "
                 "train-images-idx3-ubyte.gz and the other three files)");
}

}  // namespace

DataSplits load_fashion_mnist(const std::string& dir, bool normalize) {
  check_directory(dir);
  DataSplits splits;
  splits.train = load_split(dir, "train", normalize);
  TensorDataset test = load_split(dir, "t10k", normalize);
  const auto train_shape = splits.train.inputs.sizes().slice(1);
  const auto test_shape = test.inputs.sizes().slice(1);
  if (train_shape != test_shape) {
    throw CorruptData(str_cat("Fashion-MNIST in '", dir, "': test images are ", test_shape,
                              " but training images are ", train_shape));
  }
  splits.input_shape = train_shape.vec();
  splits.test = std::move(test);
  splits.num_classes = kClasses;
  splits.language_model = false;
  return splits;
}

DataSplits load_fashion_mnist_test(const std::string& dir, bool normalize) {
  check_directory(dir);
  DataSplits splits;
  splits.test = load_split(dir, "t10k", normalize);
  splits.input_shape = splits.test->inputs.sizes().slice(1).vec();
  splits.num_classes = kClasses;
  splits.language_model = false;
  return splits;
}

}  // namespace krab::data
