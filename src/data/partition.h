// Partitioners: how a dataset is divided among federated clients.
//
// Federated learning is judged on data that is NOT identically distributed across clients (a
// hospital sees its own patients, a region its own customers), so experiments need controlled
// ways to make skew. partition() splits the examples of one split into `clients` disjoint
// index lists; together they cover every example exactly once. Three kinds:
//
//   iid        a random permutation cut into `clients` contiguous parts whose sizes differ by at
//              most one.
//   classes    FedAvg's pathological non-IID split (McMahan et al. 2017, section 3): sort the
//              examples by label, cut them into clients * classes_per_client equal shards
//              (the first N mod shards shards get one extra example) and give each client
//              classes_per_client shards drawn at random without replacement. With 2 shards
//              per client most clients see exactly two classes (a client may draw two shards of
//              one class, as in the paper).
//   dirichlet  label skew as in Hsu et al. 2019: for each class c, draw proportions
//              p_c ~ Dirichlet(alpha, ..., alpha) over the clients and deal class c's examples
//              (in random order) to the clients in those proportions. Small alpha (0.1) gives
//              each client few classes; large alpha (100) approaches iid. Draws are repeated
//              (up to 100 times, each from a fresh stream of the seed) until every client has at
//              least one example.
//
// Determinism: the result depends only on (labels, num_classes, spec) — krab's own generator
// (data/rng.h), never torch's. Each client's list is in ascending index order.
//
// Errors (InvalidArgument, naming the federated.* key): clients < 1 or more clients than
// examples; an unknown kind (the message lists iid, classes, dirichlet); alpha <= 0;
// classes_per_client < 1 or clients * classes_per_client > examples; labels that are not a 1-D
// int64 tensor with values in [0, num_classes); a dirichlet split that leaves a client empty
// after 100 draws (too many clients for the data at that alpha).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace krab::data {

struct PartitionSpec {
  std::string kind = "iid";  // iid | classes | dirichlet
  int64_t clients = 1;
  double alpha = 0.5;              // dirichlet
  int64_t classes_per_client = 2;  // classes
  uint64_t seed = 0;
};

// Index lists, one per client (client i gets result[i]).
std::vector<std::vector<int64_t>> partition(const at::Tensor& labels, int64_t num_classes,
                                            const PartitionSpec& spec);

// A Gamma(shape, 1) sample (Marsaglia and Tsang 2000; shape < 1 through the
// Gamma(shape + 1) * U^(1/shape) identity). shape > 0. Exposed for tests.
double sample_gamma(double shape, std::mt19937_64& rng);

}  // namespace krab::data
