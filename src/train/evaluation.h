// Evaluation of a group's model on the test split. Every rank of the group holds the same
// parameters (or has just settled them), so each evaluates a contiguous share of the examples and
// the group adds up the sums (EvalSums, train/job.h): the value is the metric over the union,
// as one process evaluating every example would compute it, up to float summation order.
//
// Which examples: the first evaluation_size(test.size(), eval_examples) of the split
// (train.eval_examples; the whole split when that is 0). The subset does not depend on the
// group's size, so a 1-worker and a 4-worker run of the same job report the same examples'
// metric; rank r of W evaluates examples n*r/W .. n*(r+1)/W of those n.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "models/model.h"
#include "train/job.h"

namespace krab::train {

// `metric` of `model` (in the mode the caller put it in: eval()) on the examples above, over
// `comm`. Collective: every rank of `comm` calls it with the same test split and eval_examples,
// and every rank returns the same value. Blocks for one all-reduce of two doubles, under the
// communicator's timeout.
double evaluate(models::Model& model, Metric metric, const data::Dataset& test,
                int64_t eval_examples, comm::Communicator& comm);

// The same examples' metric on this process alone (a parameter-server worker's deferred
// evaluations, which have no group).
double evaluate_alone(models::Model& model, Metric metric, const data::Dataset& test,
                      int64_t eval_examples);

}  // namespace krab::train
