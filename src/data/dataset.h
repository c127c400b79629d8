// Datasets and the loaders that build them.
//
// Every loader returns a DataSplits: whole splits held as tensors in memory (the datasets krab
// ships with are tens of megabytes), plus the facts a model needs to size itself. The one
// exception is a directory of tensor shards (load_tensors with `lazy`), whose training split is
// a Dataset that reads its shards on demand (data/shards.h). Two kinds of task share the type:
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
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace krab::data {

// How a dataset's examples are grouped into shards that are cheap to read together, for the
// sampler (data/sampler.h), which then keeps each stretch of batches inside a window of shards.
// Shard k holds the examples numbered sum(shard_sizes[0..k)) onwards. No shards (the default)
// means the examples are in memory and any order costs the same.
struct ShardLayout {
  std::vector<int64_t> shard_sizes;  // examples per shard, in index order; empty: one block
  int64_t window = 0;                // shards shuffled together (>= 1 when there are shards)
};

// Examples numbered 0..size()-1, each an input and a target: what the trainer draws its batches
// from (data::gather). Implementations say in their header whether get() is thread-safe.
class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of examples.
  virtual int64_t size() const = 0;

  // {inputs[idx], targets[idx]}: new tensors (copies) in the order of `idx`, with a first
  // dimension of idx.size(). Indices outside [0, size()) throw.
  virtual std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& idx) const = 0;

  // Bytes of examples this dataset holds in memory at most: the preflight's memory estimate.
  virtual int64_t resident_bytes() const = 0;

  // The shard grouping the sampler should respect; none by default.
  virtual ShardLayout layout() const { return {}; }
};

// One split held in memory. inputs and targets have the same first dimension, the number of
// examples. A value type: copies share the tensors. get() is thread-safe.
struct TensorDataset final : Dataset {
  TensorDataset() = default;
  TensorDataset(at::Tensor inputs_in, at::Tensor targets_in)
      : inputs(std::move(inputs_in)), targets(std::move(targets_in)) {}

  at::Tensor inputs;
  at::Tensor targets;
  // Number of examples (inputs.size(0)); 0 for a default-constructed dataset.
  int64_t size() const override;
  // index_select on dim 0; out-of-range indices throw LibTorch's c10::Error.
  std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& idx) const override;
  int64_t resident_bytes() const override;
};

struct DataSplits {
  TensorDataset train;                // empty when lazy_train holds the training split
  std::optional<TensorDataset> test;  // absent when the loader was asked for no test split
  std::vector<int64_t> input_shape;   // per-example shape: {1, 28, 28}, {features}, {T}
  int64_t num_classes = 0;            // classes, or the vocabulary size (256) for text
  bool language_model = false;        // true for text
  // A training split read from disk on demand (a directory of tensor shards loaded with `lazy`);
  // null for every in-memory split. Code that only draws batches uses training(); code that
  // needs the tensors themselves (federated partitioning) asks the loader for memory instead.
  std::shared_ptr<const Dataset> lazy_train;
  // The test split read on demand (image folders and shard directories loaded with `lazy`);
  // `test` is then absent. Evaluation reads it a batch at a time through testing().
  std::shared_ptr<const Dataset> lazy_test;

  // The training split, wherever it lives.
  const Dataset& training() const { return lazy_train ? *lazy_train : train; }
  // The test split, wherever it lives; null when there is none.
  const Dataset* testing() const {
    if (lazy_test) return lazy_test.get();
    return test ? &*test : nullptr;
  }
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
// column is only centred). input_shape is {features}; num_classes is `num_classes`
// (data.num_classes), or when that is 0 the largest label + 1 (at least 2, at most
// kMaxInferredClasses).
// InvalidArgument: a missing file, no column `label_column` (the message lists the header),
// test_fraction outside [0, 1), fewer than 2 rows, or no feature column. CorruptData naming the
// file, line and column: a row with the wrong number of fields, an empty or non-numeric value,
// a label that is not a non-negative integer below num_classes (below kMaxInferredClasses when
// num_classes is 0: the message then says data.num_classes).
DataSplits load_csv(const std::string& path, const std::string& label_column, double test_fraction,
                    bool normalize, int64_t num_classes = 0);

// The most classes a loader infers from the labels it reads (the largest label + 1) when the
// job does not state the number (data.num_classes 0): the number sizes the model's output
// layer, so a single forged label must not make it millions wide. 65536 is above any
// classification data set krab is meant for (ImageNet-21k has 21,841 classes); a job with more
// states data.num_classes.
inline constexpr int64_t kMaxInferredClasses = 65536;

// What load_tensors needs besides data.path (the data.* keys of the same names).
struct TensorsOptions {
  std::string test_path;       // file or directory of the test split; empty: no test split
  int64_t num_classes = 0;     // 0: the largest training label + 1, at most kMaxInferredClasses
  int64_t cache_mb = 1024;     // MiB of training shards kept in memory (lazy)
  int64_t shuffle_window = 0;  // shards per shuffle window; 0: as many as fit in cache_mb
  bool lazy = false;           // a directory becomes lazy_train instead of one tensor in memory
};

// Tensors saved from Python with torch.save({"x": X, "y": Y}, FILE) (the zip format torch has
// written by default since 1.6; read without Python, tensor_file.h). `path` is one such file or
// a directory whose *.pt and *.pth files (sorted by name) are the shards of one dataset, in that
// order. X may have any dtype and shape [N, ...] and keeps them; Y is [N, ...] of an integer
// dtype (classes, converted to int64) or a floating one (regression targets, kept).
// input_shape is X's shape without N. num_classes: for integer targets `num_classes`, or the
// largest training label + 1 (at least 2); for float targets the number of values per example.
//
// A single file, or a directory without `lazy`, is read into memory. A directory with `lazy`
// is opened as a ShardedDataset in lazy_train: only each shard's header and labels are read
// now, the examples when a batch needs them, at most cache_mb MiB at a time (data/shards.h).
// The test split (test_path) likewise: a file, or a directory without `lazy`, is read into
// memory; a directory with `lazy` becomes a ShardedDataset in lazy_test whose cache holds its
// largest shard (evaluation reads it in order, one shard at a time, besides the training cache).
//
// InvalidArgument naming the file (or the data.* key): a missing path; a directory without
// shards; a file that is not a torch.save dict with tensors "x" and "y"; x and y of different
// lengths; shards or a test split whose x or y per-example shape or dtype differ from the first
// training file's; with integer targets, a label below 0 or at or above num_classes, or with
// num_classes 0 a training label of kMaxInferredClasses or more (the message names the label,
// the file and data.num_classes); a tensor stating more elements than its storage holds
// (tensor_file.h, checked before it is read); a shard
// larger than cache_mb, or a shuffle window that does not fit in it. CorruptData naming the
// file: an archive torch cannot read (truncated, damaged).
DataSplits load_tensors(const std::string& path, const TensorsOptions& options);

}  // namespace krab::data
