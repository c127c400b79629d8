#include "train/dry_run.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>

#include "models/forward_error.h"
#include "models/torchscript.h"
#include "train/job.h"

namespace krab::train {
namespace {

// Puts back what one forward and backward can change, whatever way the step ends: parameters'
// gradients, buffers (BatchNorm's running statistics and counter), train/eval mode, and the
// default generator a dropout draws from. Parameters themselves are never stepped.
class UnchangedModel {
 public:
  explicit UnchangedModel(models::Model& m) : model_(m), training_(m.is_training()) {
    for (const at::Tensor& p : m.parameters())
      grads_.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    for (const at::Tensor& b : m.buffers()) buffers_.push_back(b.clone());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng_ = gen.get_state();
  }
  ~UnchangedModel() {
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (at::Tensor& p : model_.parameters()) p.mutable_grad() = grads_[i++];
    i = 0;
    for (at::Tensor& b : model_.buffers()) b.copy_(buffers_[i++]);
    model_.train(training_);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_);
  }
  UnchangedModel(const UnchangedModel&) = delete;
  UnchangedModel& operator=(const UnchangedModel&) = delete;

 private:
  models::Model& model_;
  bool training_;
  std::vector<at::Tensor> grads_, buffers_;
  at::Tensor rng_;
};

// Python's name of a dtype, as users wrote it ("torch.float64").
std::string python_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kLong:
      return "torch.int64";
    case at::kInt:
      return "torch.int32";
    case at::kByte:
      return "torch.uint8";
    case at::kBool:
      return "torch.bool";
    default:
      return c10::toString(t);
  }
}

at::ScalarType parameter_dtype(models::Model& model) {
  for (const at::Tensor& p : model.parameters())
    if (p.is_floating_point()) return p.scalar_type();
  return at::ScalarType::Undefined;
}

// What krab can add to the library's cause of a failed forward: the two dtypes when the inputs
// are floating point of another dtype than the parameters, or integers where the cause is about
// dtypes (the op's message names neither the data nor which side is which: "mat1 and mat2 must
// have the same dtype"); the two sizes of a Linear layer that does not fit. Integer inputs that
// an embedding takes (gpt's tokens) never get here: their forward does not fail.
std::string explain(const std::string& cause, const at::Tensor& x, at::ScalarType weights) {
  const bool about_dtypes =
      cause.find("dtype") != std::string::npos || cause.find("scalar type") != std::string::npos;
  if (weights != at::ScalarType::Undefined && x.scalar_type() != weights &&
      (x.is_floating_point() || about_dtypes))
    return str_cat(": the data's inputs are ", python_dtype(x.scalar_type()),
                   ", the model's parameters ", python_dtype(weights), " (save the inputs as ",
                   python_dtype(weights), ", e.g. x.float())");
  // linear() multiplies [rows, got] by the transposed weight, [expects, out].
  int64_t rows = 0, got = 0, expects = 0, out = 0;
  if (std::sscanf(cause.c_str(),
                  "mat1 and mat2 shapes cannot be multiplied (%" SCNd64 "x%" SCNd64 " and %" SCNd64
                  "x%" SCNd64 ")",
                  &rows, &got, &expects, &out) == 4) {
    const int64_t values = x.dim() > 1 ? x[0].numel() : 1;
    return str_cat(": a Linear layer expects ", expects, " input features but gets ", got,
                   got == values ? str_cat(", the ", values, " values of one example of the data ",
                                           x.sizes().slice(1))
                                 : std::string());
  }
  return "";
}

// The library's full text in a file of its own, when it holds more than the cause; "" when not
// needed or not writable (the error line is what matters).
std::string keep_details(const std::string& details) {
  if (details.find('\n') == std::string::npos ||
      details.find_first_not_of(" \n") == std::string::npos)
    return "";
  const char* tmp = std::getenv("TMPDIR");
  std::string path = str_cat(tmp && *tmp ? tmp : "/tmp", "/krab-forward-XXXXXX.txt");
  const int fd = ::mkstemps(path.data(), 4);
  if (fd < 0) return "";
  FILE* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    ::close(fd);
    return "";
  }
  const bool ok = std::fwrite(details.data(), 1, details.size(), f) == details.size();
  return std::fclose(f) == 0 && ok ? path : "";
}

std::string loss_name(const core::Config& c, models::Model& model) {
  return models::as_torchscript(model) ? c.get_string("train.loss") : "cross_entropy";
}

}  // namespace

std::string name_model(const core::Config& c) {
  return c.get_string("model.name") == "torchscript"
             ? str_cat("model.path '", c.get_string("model.path"), "'")
             : str_cat("model.name '", c.get_string("model.name"), "'");
}

std::string name_data(const core::Config& c) {
  return c.get_string("data.name") == "synthetic"
             ? std::string("data.name 'synthetic'")
             : str_cat("data.path '", c.get_string("data.path"), "'");
}

namespace {

[[noreturn]] void throw_failure(const core::Config& c, models::Model& model,
                                const std::string& phase, const at::Tensor& x, size_t examples,
                                const std::string& cause, const std::string& details) {
  std::string line =
      str_cat(name_model(c), ": ", phase, " on the first ",
              examples == 1 ? std::string("example") : str_cat(examples, " examples"), " of ",
              name_data(c), " failed: ", cause);
  if (phase == "forward" || phase == "training_loss")
    line += explain(cause, x, parameter_dtype(model));
  const std::string file = keep_details(details);
  if (!file.empty()) line += str_cat(" (traceback in ", file, "; --verbose prints it)");
  throw models::ForwardError(line, cause, details);
}

}  // namespace

void dry_run(models::Model& model, const data::DataSplits& d, const core::Config& c) {
  const data::Dataset& train = d.training();
  if (train.size() == 0) return;
  std::vector<int64_t> first(static_cast<size_t>(std::min<int64_t>(2, train.size())));
  std::iota(first.begin(), first.end(), 0);
  const auto [x, y] = train.get(first);
  const models::TorchScriptModel* ts = models::as_torchscript(model);
  const bool own_loss = ts != nullptr && ts->has_training_loss();
  UnchangedModel unchanged(model);
  // The phase that failed, as the error line names it.
  std::string phase = own_loss ? "training_loss" : "forward";
  try {
    check_model_fits_data(model, d);  // TorchScript: outputs against every label, in eval mode
    model.train();
    at::Tensor loss;
    if (own_loss) {
      loss = model.training_loss(x, y);
    } else {
      phase = "forward";
      const at::Tensor outputs = model.forward(x);
      phase = str_cat("train.loss ", loss_name(c, model), " of outputs ", outputs.sizes(), " ",
                      python_dtype(outputs.scalar_type()), " against labels ", y.sizes(), " ",
                      python_dtype(y.scalar_type()));
      loss = model.loss(outputs, y);
    }
    phase = "backward";
    loss.backward();
  } catch (const models::ForwardError& e) {
    // A TorchScript method failed: the cause and the traceback are already set apart.
    throw_failure(c, model, phase, x, first.size(), e.cause(), e.details());
  } catch (const Error&) {
    throw;  // krab's own refusals already name the model and what is wrong
  } catch (const std::exception& e) {
    const models::LibraryError failure = models::describe_library_error(e);
    throw_failure(c, model, phase, x, first.size(), failure.cause, failure.details);
  }
}

}  // namespace krab::train
