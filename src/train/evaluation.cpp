#include "train/evaluation.h"

#include <torch/torch.h>

namespace krab::train {

double evaluate(models::Model& model, Metric metric, const data::Dataset& test,
                int64_t eval_examples, comm::Communicator& comm) {
  const int64_t n = evaluation_size(test.size(), eval_examples);
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  const EvalSums part = evaluate_range(model, metric, test, lo, hi);
  // Float64: a sum of up to millions of correct predictions stays exact.
  auto sums = torch::tensor({part.sum, part.count}, torch::kFloat64);
  comm.allreduce(sums)->wait();
  return EvalSums{sums[0].item<double>(), sums[1].item<double>()}.value();
}

double evaluate_alone(models::Model& model, Metric metric, const data::Dataset& test,
                      int64_t eval_examples) {
  return evaluate_range(model, metric, test, 0, evaluation_size(test.size(), eval_examples))
      .value();
}

}  // namespace krab::train
