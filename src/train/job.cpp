#include "train/job.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>
#include <tuple>

#include "core/errors.h"
#include "data/images.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "models/torchscript.h"

namespace krab::train {
namespace {

data::ImageOptions image_options(const core::Config& c) {
  data::ImageOptions o;
  std::tie(o.height, o.width) = data::parse_image_size(c.get_string("data.size"));
  o.channels = c.get_int("data.channels");
  KRAB_CHECK_ARG(o.channels != 2, "data.channels must be 0, 1 or 3, got 2");
  o.mean = data::parse_number_list(c.get_string("data.mean"), "data.mean");
  o.std = data::parse_number_list(c.get_string("data.std"), "data.std");
  o.random_crop = c.get_int("data.random_crop");
  o.random_flip = c.get_bool("data.random_flip");
  o.threads = c.get_int("data.decode_threads");
  o.skip_bad = c.get_bool("data.skip_bad");
  o.test_path = c.get_string("data.test_path");
  o.max_pixels = c.get_int("data.max_pixels");
  return o;
}

// Lazy: listed and header-checked at load, decoded per batch on data.decode_threads threads
// (image_batches), at most data.cache_mb MiB of decoded training images kept; in memory: decoded
// at load. The files skipped at load are one line on stderr, from the one process `notes` says
// (job.h: rank 0, not the launcher's check and each worker again); a file replaced while
// training, one line from each worker that meets it.
data::DataSplits load_image_data(const core::Config& c, DataResidency residency, LoadNotes notes) {
  data::ImageOptions o = image_options(c);
  o.lazy = residency == DataResidency::kLazy;
  o.cache_mb = c.get_int("data.cache_mb");
  o.note = [](const std::string& line) {
    std::fprintf(stderr, "krab: data.skip_bad: %s\n", line.c_str());
  };
  int64_t skipped = 0;
  data::DataSplits d = data::load_images(c.get_string("data.path"), o, &skipped);
  if (skipped > 0 && notes == LoadNotes::kSay)
    std::fprintf(stderr, "krab: data.skip_bad: skipped %lld unreadable image(s) under '%s'\n",
                 static_cast<long long>(skipped), c.get_string("data.path").c_str());
  return d;
}

// Up to 256 labels of the training split (of the test split when there is no training data),
// as stored, and the key that names their file; undefined when there are none. Nothing is read
// for integer labels that are known without reading (an image folder's list, a shard directory
// with class labels, whose largest its loader kept); other lazy splits read one example, and
// 256 only when its label is a float (then the job is refused).
at::Tensor some_labels(const data::DataSplits& d, std::string& key) {
  const data::Dataset* split = &d.training();
  key = "data.path";
  if (split->size() == 0) {
    split = d.testing();
    key = "data.test_path";
  }
  if (split == nullptr || split->size() == 0) return {};
  const int64_t n = std::min<int64_t>(split->size(), 256);
  if (const auto* memory = dynamic_cast<const data::TensorDataset*>(split))
    return memory->targets.narrow(0, 0, n);
  if (const auto* images = dynamic_cast<const data::ImageFolderDataset*>(split))
    return images->targets().narrow(0, 0, n);
  if (const auto* shards = dynamic_cast<const data::ShardedDataset*>(split))
    if (shards->largest_label() >= 0) return torch::tensor({shards->largest_label()});
  const at::Tensor first = split->get({0}).second;
  if (!at::isFloatingType(first.scalar_type())) return first;
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  return split->get(idx).second;
}

// cross_entropy and nll take class indices. PyTorch reads a float target as class probabilities
// ([N, C]; a float target [N] is an error there). Accepting float labels would mean a silent
// cast (0.7 becomes class 0) and `auto` reporting a test loss where the user expects accuracy,
// so they are refused, naming the file, its dtype and the fix: y.long() for whole numbers, a
// regression loss for values. `loss` is what applies, as messages say it ("train.loss
// cross_entropy", or "model.name mlp (cross_entropy)" for a built-in model, which has no other).
void refuse_float_class_labels(const core::Config& c, const data::DataSplits& d,
                               const std::string& loss) {
  std::string key;
  const at::Tensor y = some_labels(d, key);
  if (!y.defined() || !at::isFloatingType(y.scalar_type())) return;
  const at::Tensor flat = y.flatten();
  const at::Tensor fractional = flat.ne(flat.floor()).nonzero();
  const std::string where = str_cat(key, " '", c.get_string(key), "': y holds ", y.scalar_type(),
                                    " labels, but ", loss, " takes class indices");
  if (fractional.numel() == 0)
    throw InvalidArgument(str_cat(where, " as integers; save them as int64: y.long()",
                                  y.dim() > 1 ? " (y.argmax(-1) for one-hot rows)" : ""));
  const double value = flat[fractional[0][0].item<int64_t>()].item<double>();
  throw InvalidArgument(str_cat(where, ", and ", value,
                                " is not one; for regression targets use train.loss mse or "
                                "bce_with_logits (model.name torchscript); class probabilities "
                                "are not supported"));
}

// The same where train.loss applies: a module without its own training_loss (which takes
// whatever it takes) with cross_entropy or nll, or a built-in model.
void check_class_labels(const core::Config& c, models::Model& model, const data::DataSplits& d) {
  const std::string& loss = c.get_string("train.loss");
  const models::TorchScriptModel* ts = models::as_torchscript(model);
  if ((ts != nullptr && ts->has_training_loss()) || (loss != "cross_entropy" && loss != "nll"))
    return;
  refuse_float_class_labels(
      c, d,
      ts != nullptr ? "train.loss " + loss
                    : str_cat("model.name ", c.get_string("model.name"), " (cross_entropy)"));
}

}  // namespace

data::DataSplits load_data(const core::Config& c, DataResidency residency, LoadNotes notes) {
  const std::string& name = c.get_string("data.name");
  if (name == "fashion-mnist")
    return data::load_fashion_mnist(c.get_string("data.path"), c.get_bool("data.normalize"));
  if (name == "synthetic")
    return data::make_synthetic(
        c.get_int("data.synthetic_samples"), c.get_int("data.synthetic_features"),
        c.get_int("data.synthetic_classes"), c.get_float("data.test_fraction"),
        static_cast<uint64_t>(c.get_int("train.seed")));
  const std::string& sp_model = c.get_string("data.tokenizer.sentencepiece");
  KRAB_CHECK_ARG(sp_model.empty() || name == "text",
                 "data.tokenizer.sentencepiece is for "
                 "data.name 'text', not '",
                 name, "'");
  if (name == "text")
    return data::load_text(
        c.get_string("data.path"), c.get_int("model.context"), c.get_float("data.test_fraction"),
        *(sp_model.empty()
              ? data::byte_tokenizer()
              : data::sentencepiece_tokenizer(sp_model, "data.tokenizer.sentencepiece")));
  if (name == "csv")
    return data::load_csv(c.get_string("data.path"), c.get_string("data.label_column"),
                          c.get_float("data.test_fraction"), c.get_bool("data.normalize"),
                          c.get_int("data.num_classes"));
  if (name == "images") return load_image_data(c, residency, notes);
  if (name == "tensors") {
    data::TensorsOptions o;
    o.test_path = c.get_string("data.test_path");
    o.num_classes = c.get_int("data.num_classes");
    o.cache_mb = c.get_int("data.cache_mb");
    o.shuffle_window = c.get_int("data.shuffle_window");
    o.lazy = residency == DataResidency::kLazy;
    return data::load_tensors(c.get_string("data.path"), o);
  }
  throw InvalidArgument(str_cat("data.name: unknown dataset '", name, "'"));
}

std::unique_ptr<data::BatchPrefetcher> image_batches(const core::Config& c,
                                                     const data::DataSplits& d,
                                                     const data::GlobalBatchSampler& sampler,
                                                     int64_t end_step) {
  if (c.get_string("data.name") != "images") return nullptr;
  std::shared_ptr<const data::Dataset> train =
      d.lazy_train ? d.lazy_train : std::make_shared<data::TensorDataset>(d.train);
  return data::prefetch_image_batches(std::move(train), sampler, image_options(c),
                                      static_cast<uint64_t>(c.get_int("train.seed")), end_step);
}

models::ModelSpec model_spec(const core::Config& c, const data::DataSplits& d) {
  models::ModelSpec s;
  s.name = c.get_string("model.name");
  s.input_shape = d.input_shape;
  s.num_classes = d.num_classes;
  s.hidden = c.get_int("model.hidden");
  s.layers = c.get_int("model.layers");
  s.width = c.get_int("model.width");
  s.heads = c.get_int("model.heads");
  s.context = c.get_int("model.context");
  s.path = c.get_string("model.path");
  s.loss = c.get_string("train.loss");
  s.freeze_batchnorm = c.get_bool("model.freeze_batchnorm");
  s.trust_code = c.get_bool("model.trust_code");
  KRAB_CHECK_ARG(s.name != "torchscript" || !s.path.empty(),
                 "model.path: model.name torchscript needs the file of a TorchScript module");
  if (s.name == "torchscript") return s;  // it decides for itself what data it takes
  // Before the model is built: float labels would make it one class wide, and the error say so.
  refuse_float_class_labels(c, d, str_cat("model.name ", s.name, " (cross_entropy)"));
  KRAB_CHECK_ARG(!d.language_model || s.name == "gpt", "model.name '", s.name,
                 "' cannot train on data.name 'text' (use model.name: gpt)");
  KRAB_CHECK_ARG(d.language_model || s.name != "gpt", "model.name 'gpt' needs data.name: text");
  return s;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const core::Config& c,
                                                        std::vector<at::Tensor> params) {
  const std::string& name = c.get_string("train.optimizer.name");
  const double lr = c.get_float("train.optimizer.lr");
  const double wd = c.get_float("train.optimizer.weight_decay");
  if (name == "sgd")
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr)
                    .momentum(c.get_float("train.optimizer.momentum"))
                    .weight_decay(wd));
  if (name == "adam")
    return std::make_unique<torch::optim::Adam>(params,
                                                torch::optim::AdamOptions(lr).weight_decay(wd));
  if (name == "adamw")
    return std::make_unique<torch::optim::AdamW>(params,
                                                 torch::optim::AdamWOptions(lr).weight_decay(wd));
  throw InvalidArgument(str_cat("train.optimizer.name: unknown optimizer '", name, "'"));
}

int64_t total_steps(const core::Config& c, const data::GlobalBatchSampler& sampler, int64_t accum) {
  if (c.get_int("train.steps") > 0) return c.get_int("train.steps");
  return c.get_int("train.epochs") * (sampler.steps_per_epoch() / accum);
}

Straggler::Straggler(const core::Config& c, int rank)
    : active_(c.get_int("train.slow_rank") == rank),
      factor_(c.get_float("train.slow_factor")),
      delay_ms_(c.get_float("train.slow_delay_ms")) {}

void Straggler::after_compute(std::chrono::steady_clock::duration compute) const {
  if (!active_) return;
  if (delay_ms_ > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(delay_ms_ * 1000)));
  else
    std::this_thread::sleep_for(compute * (factor_ - 1));
}

namespace {

// Examples lo..lo+len of `test`: views of an in-memory split, or read (decoded) from a lazy one.
std::pair<at::Tensor, at::Tensor> test_batch(const data::Dataset& test, int64_t lo, int64_t len) {
  if (const auto* memory = dynamic_cast<const data::TensorDataset*>(&test))
    return {memory->inputs.narrow(0, lo, len), memory->targets.narrow(0, lo, len)};
  std::vector<int64_t> idx(static_cast<size_t>(len));
  std::iota(idx.begin(), idx.end(), lo);
  return test.get(idx);
}

// The test split's labels where they are known without reading its examples, for the model's
// range check: all of them (in memory, image folders) or the largest (shards); undefined when
// there is no test split.
at::Tensor known_test_labels(const data::DataSplits& d) {
  if (d.test) return d.test->targets.flatten();
  if (const auto* images = dynamic_cast<const data::ImageFolderDataset*>(d.lazy_test.get()))
    return images->targets();
  if (const auto* shards = dynamic_cast<const data::ShardedDataset*>(d.lazy_test.get()))
    if (shards->largest_label() >= 0) return torch::tensor({shards->largest_label()}, torch::kLong);
  return {};
}

// The dtype of the test split's labels (one example read when the split is lazy); Undefined
// when there is no test data.
at::ScalarType test_label_dtype(const data::DataSplits& d) {
  const data::Dataset* test = d.testing();
  if (test == nullptr || test->size() == 0) return at::ScalarType::Undefined;
  if (d.test) return d.test->targets.scalar_type();
  return test->get({0}).second.scalar_type();
}

}  // namespace

std::pair<int64_t, int64_t> count_correct(models::Model& model, const data::Dataset& test,
                                          int64_t lo, int64_t hi) {
  torch::NoGradGuard no_grad;
  int64_t correct = 0, total = 0;
  for (int64_t i = lo; i < hi; i += kEvaluationBatch) {
    auto [x, y] = test_batch(test, i, std::min<int64_t>(kEvaluationBatch, hi - i));
    auto [c, t] = model.correct(model.predict(x), y);
    correct += c;
    total += t;
  }
  return {correct, total};
}

Metric resolve_metric(const core::Config& c, models::Model& model, const data::DataSplits& d) {
  const std::string& asked = c.get_string("train.metric");
  const std::string& loss = c.get_string("train.loss");
  const bool regression = loss == "mse" || loss == "bce_with_logits";
  const at::ScalarType label_dtype = test_label_dtype(d);
  const bool float_labels =
      label_dtype != at::ScalarType::Undefined && at::isFloatingType(label_dtype);
  if (asked == "accuracy") {
    KRAB_CHECK_ARG(
        !regression, "train.metric: accuracy needs class labels, but train.loss ", loss,
        " compares outputs with target values, not classes; use train.metric: loss (or auto)");
    KRAB_CHECK_ARG(!float_labels,
                   "train.metric: accuracy needs class labels, but the test labels are ",
                   label_dtype, "; use train.metric: loss (or auto)");
    return Metric::kAccuracy;
  }
  check_class_labels(c, model, d);
  if (asked == "loss") return Metric::kLoss;
  KRAB_CHECK_ARG(asked == "auto", "train.metric: unknown metric '", asked,
                 "'; known: auto, accuracy, loss");
  const models::TorchScriptModel* ts = models::as_torchscript(model);
  const bool own_loss = ts != nullptr && ts->has_training_loss() && !ts->has_predict();
  return regression || float_labels || own_loss ? Metric::kLoss : Metric::kAccuracy;
}

const char* metric_name(Metric metric) { return metric == Metric::kLoss ? "loss" : "accuracy"; }

std::string metric_key(Metric metric) { return str_cat("test_", metric_name(metric)); }

EvalSums evaluate_range(models::Model& model, Metric metric, const data::Dataset& test, int64_t lo,
                        int64_t hi) {
  EvalSums s;
  if (metric == Metric::kAccuracy) {
    const auto [correct, total] = count_correct(model, test, lo, hi);
    return {static_cast<double>(correct), static_cast<double>(total)};
  }
  torch::NoGradGuard no_grad;
  for (int64_t i = lo; i < hi; i += kEvaluationBatch) {
    const int64_t len = std::min<int64_t>(kEvaluationBatch, hi - i);
    auto [x, y] = test_batch(test, i, len);
    const at::Tensor loss = model.training_loss(x, y);
    s.sum += loss.item<double>() * static_cast<double>(len);
    s.count += static_cast<double>(len);
  }
  return s;
}

int64_t evaluation_size(int64_t size, int64_t eval_examples) {
  return eval_examples > 0 ? std::min(size, eval_examples) : size;
}

void print_model_warnings(const models::Model& model) {
  if (const auto* ts = dynamic_cast<const models::TorchScriptModel*>(&model))
    for (const std::string& w : ts->warnings())
      std::fprintf(stderr, "krab: warning: %s\n", w.c_str());
}

void check_model_fits_data(models::Model& model, const data::DataSplits& d) {
  models::TorchScriptModel* ts = models::as_torchscript(model);
  const data::Dataset& train = d.training();
  if (ts == nullptr || train.size() == 0) return;  // built-in models are shaped for the data
  const std::vector<int64_t> first =
      train.size() >= 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
  auto [x, y] = train.get(first);
  // Every label, for their range: a split read from shards keeps them on disk, but its loader
  // read them all and kept the largest (and refused negative ones).
  at::Tensor labels = d.train.targets.defined() ? d.train.targets.flatten() : y.flatten();
  if (const auto* images = dynamic_cast<const data::ImageFolderDataset*>(d.lazy_train.get()))
    labels = images->targets();
  if (const auto* shards = dynamic_cast<const data::ShardedDataset*>(d.lazy_train.get()))
    if (shards->largest_label() >= 0)
      labels = torch::cat({labels, torch::tensor({shards->largest_label()}, labels.options())});
  if (const at::Tensor test = known_test_labels(d); test.defined())
    labels = torch::cat({labels, test.to(labels.scalar_type())});
  ts->check_fits(x, y, labels);
}

std::string run_directory(const core::Config& c) {
  std::string dir = c.get_string("checkpoint.dir");
  std::string name = c.get_string("name").empty() ? "job" : c.get_string("name");
  for (auto at = dir.find("{name}"); at != std::string::npos; at = dir.find("{name}"))
    dir.replace(at, 6, name);
  return dir;
}

}  // namespace krab::train
