// What every training mode builds from a job's Config the same way: the data, the model's
// spec, the optimizer, the number of steps and the run directory. With checkpoint.h and
// schedule.h this is the small job library (krab_job) that the trainer, the parameter-server
// mode and federated learning share; it knows nothing of how gradients travel.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/dataset.h"
#include "data/prefetch.h"
#include "data/sampler.h"
#include "models/model.h"

namespace torch::optim {
class Optimizer;
}

namespace krab::train {

// Where load_data may leave the training split: in memory (DataSplits::train), or, for a data
// set that can be read on demand (data.name: tensors with a directory of shards), on disk behind
// DataSplits::lazy_train. Code that draws batches through DataSplits::training() asks for kLazy;
// code that needs the training tensors themselves (federated partitioning) for kInMemory.
enum class DataResidency { kInMemory, kLazy };

// Whether load_data says on stderr how many unreadable images data.skip_bad left out (one line,
// "krab: data.skip_bad: skipped N unreadable image(s) under 'PATH'"). Every process of a job
// loads the data (the launcher to check it, then each worker), and the line is said once per
// job: by rank 0's worker (kSay), not by the launcher's check or the other ranks (kQuiet); a
// process that is a job of its own (fl-sim, a federated client) says it (kSay, the default).
enum class LoadNotes { kSay, kQuiet };

// data.name's dataset. Throws InvalidArgument / CorruptData naming the key or file.
data::DataSplits load_data(const core::Config& c,
                           DataResidency residency = DataResidency::kInMemory,
                           LoadNotes notes = LoadNotes::kSay);

// For data.name images: the batches of the training split made ahead on data.decode_threads
// background threads (decoding, when the split is lazy, + the job's random crop / flip, seeded
// by train.seed, the step's epoch and the example), for sampler steps below `end_step`. Null
// for every other dataset, whose batches the training thread gathers itself. The training
// split is shared (lazy) or copied, and `sampler` copied.
std::unique_ptr<data::BatchPrefetcher> image_batches(const core::Config& c,
                                                     const data::DataSplits& d,
                                                     const data::GlobalBatchSampler& sampler,
                                                     int64_t end_step);

// The model the job asks for, shaped for the data; refuses model/data mismatches, a built-in
// model (trained with cross_entropy) on float labels among them (as resolve_metric, before a
// model one class wide is built).
models::ModelSpec model_spec(const core::Config& c, const data::DataSplits& d);

// train.optimizer over `params`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const core::Config& c,
                                                        std::vector<at::Tensor> params);

// train.steps, or train.epochs in optimizer steps of `accum` micro-batches.
int64_t total_steps(const core::Config& c, const data::GlobalBatchSampler& sampler, int64_t accum);

// checkpoint.dir with {name} replaced.
std::string run_directory(const core::Config& config);

// The artificial straggler of benchmarks and tests (train.slow_rank): after each
// forward+backward, rank train.slow_rank sleeps train.slow_delay_ms, or (slow_factor - 1)
// times the compute it just did when no fixed delay is set.
class Straggler {
 public:
  Straggler(const core::Config& c, int rank);
  void after_compute(std::chrono::steady_clock::duration compute) const;

 private:
  bool active_ = false;
  double factor_ = 1, delay_ms_ = 0;
};

// A TorchScript model tried on the first training batch and checked against every label
// (models::TorchScriptModel::check_fits); nothing for a built-in model. Throws
// InvalidArgument naming model.path and the shapes or labels at fault.
void check_model_fits_data(models::Model& model, const data::DataSplits& d);

// Prints each of a TorchScript model's warnings (models::TorchScriptModel::warnings: buffers
// whose persistence the file does not record, flags a trace fixed to eval) on stderr as
// "krab: warning: ..."; nothing for a built-in model. Called once per job where the model is first
// made: the launcher's preflight, fl-sim, fl-server (not by every worker).
void print_model_warnings(const models::Model& model);

// Examples evaluation runs through the model at once (count_correct, evaluate_range); the
// memory plan sizes evaluation's activations by it (memory_plan.h).
constexpr int64_t kEvaluationBatch = 512;

// Test accuracy of `model` (its predict()) on examples lo..hi of `test`, in memory or read a
// batch of kEvaluationBatch at a time: (correct, total).
std::pair<int64_t, int64_t> count_correct(models::Model& model, const data::Dataset& test,
                                          int64_t lo, int64_t hi);

// What evaluation measures on the test split (train.metric, resolved for the job's model).
enum class Metric { kAccuracy, kLoss };

// train.metric for `model` and the data `d`. `auto` is accuracy unless the labels are not
// classes: loss for train.loss mse or bce_with_logits, for float test labels, and for a
// TorchScript module with its own training_loss but no predict (its loss may be anything;
// with a predict it is a classifier). InvalidArgument naming train.metric for `accuracy` where
// there are no classes to compare (mse, bce_with_logits, float test labels); and, whatever
// train.metric says, InvalidArgument naming data.path, the labels' dtype and the fix for float
// labels where train.loss cross_entropy or nll applies (a built-in model, or a module without
// its own training_loss): those losses take class indices, so float labels are refused rather
// than cast (whole numbers: save y.long(); other values: a regression loss).
Metric resolve_metric(const core::Config& c, models::Model& model, const data::DataSplits& d);

// "accuracy" | "loss": the report's "metric".
const char* metric_name(Metric metric);
// "test_accuracy" | "test_loss": the report's field and the evaluation's gauge.
std::string metric_key(Metric metric);

// Sums that evaluation adds up over examples: for accuracy the correct predictions and the
// predictions; for loss each batch's training loss times its examples, and the examples. The
// sums of disjoint ranges add up (the ranks of a group), so value() is the metric over the
// union: for loss the example-weighted mean, not a mean of batch means.
struct EvalSums {
  double sum = 0, count = 0;
  double value() const { return count > 0 ? sum / count : 0; }
};

// `metric` of `model` on examples lo..hi of `test`, in batches of kEvaluationBatch, without
// gradients and in the mode the model is in (the caller puts it in eval()). The loss is the one
// training backpropagates (training_loss: train.loss of forward, or the module's own), assumed to
// be a mean over the batch's examples.
EvalSums evaluate_range(models::Model& model, Metric metric, const data::Dataset& test, int64_t lo,
                        int64_t hi);

// How many examples of a test split of `size` evaluation reads: the first `eval_examples`
// (train.eval_examples), all `size` when that is 0 or larger. Every evaluation of a job takes
// examples 0..evaluation_size() of its split, so the subset is the same on any number of ranks.
int64_t evaluation_size(int64_t size, int64_t eval_examples);

}  // namespace krab::train
