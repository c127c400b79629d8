// In-memory datasets and the loaders that build them.
//
// Every loader returns a DataSplits: whole splits held as tensors in memory (the datasets krab
// ships with are tens of megabytes), plus the facts a model needs to size itself. Two kinds of
// task share the type:
//
//   classification   inputs float32 [N, ...], targets int64 [N] in [0, num_classes)
//   language model   inputs int64 [N, T] tokens, targets int64 [N, T], the same windows
//                    shifted left by one; num_classes is the vocabulary size
//
// Loaders are deterministic: the same arguments (and, for files, the same bytes) give the same
// tensors, independent of torch's global random state and of how many workers will train.
// They are safe to call from several threads at once; the returned tensors are owned by the
// caller and share nothing with any other call.
//
// Failure: a caller mistake (bad argument, missing directory or file, a file too small for the
// request) throws krab::InvalidArgument; a file that exists but fails its format checks throws
// krab::CorruptData. Both messages name the file and say what is wrong.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace krab::data {

// One split. inputs and targets have the same first dimension, the number of examples.
struct TensorDataset {
  at::Tensor inputs;
  at::Tensor targets;
  // Number of examples (inputs.size(0)); 0 for a default-constructed dataset.
  int64_t size() const;
};

struct DataSplits {
  TensorDataset train;
  std::optional<TensorDataset> test;  // absent when the loader was asked for no test split
  std::vector<int64_t> input_shape;   // per-example shape: {1, 28, 28}, {features}, {T}
  int64_t num_classes = 0;            // classes, or the vocabulary size (256) for text
  bool language_model = false;        // true for text
};

// Fashion-MNIST from the four IDX files in `dir` (Debian's dataset-fashion-mnist installs them
// in /usr/share/datasets/fashion-mnist):
//   train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte t10k-labels-idx1-ubyte
// each gzipped (name + ".gz", preferred when both exist) or plain. All four are required; t10k
// becomes the test split. Images are [N, 1, rows, cols] float32 with pixels scaled to [0, 1];
// with `normalize` they are further standardised with the training set's mean and standard
// deviation, (x - 0.2860) / 0.3530. Labels are int64.
//
// Checks, each a CorruptData naming the file: magic number (2051 for images, 2049 for labels),
// non-zero dimensions, the payload exactly as long as the header says (truncated or trailing
// bytes are both errors), a readable gzip stream, image and label counts that agree, labels
// below 10, and test images of the same size as the training images.
// A missing `dir` is InvalidArgument "dataset directory '<dir>' does not exist"; a missing file
// is InvalidArgument naming it.
DataSplits load_fashion_mnist(const std::string& dir, bool normalize);

// Only the t10k files of `dir` (the same checks), as the test split; train is empty. For a
// federated server, whose held-out data must not require the clients' training files.
DataSplits load_fashion_mnist_test(const std::string& dir, bool normalize);

// A synthetic classification problem an MLP learns to high accuracy: `classes` Gaussian
// centroids in `features` dimensions, examples drawn around them with unit noise, labels drawn
// uniformly. Generated with krab's own generator from `seed` alone, so the same arguments give
// bit-identical data on every platform. The last round(samples * test_fraction) examples form
// the test split (absent when that is 0). InvalidArgument unless samples >= 2, features >= 1,
// classes >= 2, 0 <= test_fraction < 1 and at least one example is left for training.
DataSplits make_synthetic(int64_t samples, int64_t features, int64_t classes, double test_fraction,
                          uint64_t seed);

// A byte-level language-modelling corpus from the file at `path`: every byte is a token
// (vocabulary 256). The file is cut into non-overlapping windows of context + 1 bytes (a tail
// shorter than a window is dropped); window i gives inputs[i] = its first `context` bytes and
// targets[i] = its last `context` bytes. The last round(windows * test_fraction) windows (at
// least one when test_fraction > 0, and always leaving one for training) form the test split.
// input_shape is {context}. InvalidArgument when the file is missing, context < 1,
// test_fraction is outside [0, 1), or the file holds fewer than 2 windows (the message names
// the file, its size and the bytes needed).
DataSplits load_text(const std::string& path, int64_t context, double test_fraction);

// The same with tokens from `tokenizer` (data/tokenizer.h) instead of bytes: windows of
// context + 1 tokens, num_classes = the tokenizer's vocabulary (what model.gpt takes).
class Tokenizer;
DataSplits load_text(const std::string& path, int64_t context, double test_fraction,
                     const Tokenizer& tokenizer);

// A table of numbers from the CSV file at `path` (credit scoring, sensor readings): a header
// row naming the columns, then one example per line, comma-separated. The column named
// `label_column` holds the class, an integer in [0, classes); every other column is a float
// feature. Rows are shuffled with a fixed seed (so a file sorted by label still gives a fair
// split) and the last round(rows * test_fraction) become the test split. With `normalize`, each
// feature is standardised with the training split's mean and standard deviation (a constant
// column is only centred). input_shape is {features}; num_classes is the largest label + 1
// (at least 2).
// InvalidArgument: a missing file, no column `label_column` (the message lists the header),
// test_fraction outside [0, 1), fewer than 2 rows, or no feature column. CorruptData naming the
// file, line and column: a row with the wrong number of fields, an empty or non-numeric value,
// a label that is not a non-negative integer.
DataSplits load_csv(const std::string& path, const std::string& label_column,
                    double test_fraction, bool normalize);

}  // namespace krab::data
