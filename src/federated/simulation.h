// `krab fl-sim`: the federated server and its clients in one process, for experiments.
//
// run_simulation() loads the job's data (data.*), divides the training split among
// federated.clients clients (data/partition.h: iid, classes or dirichlet), and runs
// federated.rounds rounds of the same RoundRunner `krab fl-server` runs, with in-process
// participants that execute the same client code `krab fl-client` runs (local_training.h, and
// the client side of secure aggregation). The test split is the server's held-out data.
//
// What the simulation adds, for experiments only (all default off):
//   federated.sim_dropout             a sampled client drops out of a round with this
//                                     probability (before fit, or in secure rounds after
//                                     sharing its keys, so dropout recovery is exercised);
//   federated.sim_byzantine_fraction  that fraction of clients (the first ones in a fixed
//                                     random order) send -federated.sim_attack_scale times their
//                                     true update: sign-flipped, scaled, the attack robust
//                                     aggregators are measured against.
// Dropouts and attackers are drawn from train.seed, so a run is reproducible.
//
// Output, under run_directory(config) (checkpoint.dir): fl-state.krab after every round (with
// checkpoint.resume the run continues from it), model.pt at the end; the JSON report at
// options.report_path: the per-round records (rounds.h), final accuracy, totals and the
// partition's sizes. Clients train one after another in the calling thread
// (train.threads_per_worker intra-op threads), so results do not depend on scheduling.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/dataset.h"
#include "data/partition.h"

namespace krab::federated {

struct SimulationOptions {
  std::string report_path;  // "" = no report
  bool show_progress = true;
};

nlohmann::json run_simulation(const core::Config& config, const SimulationOptions& options);

// Each client's example indices into the training split (fl-sim's clients, fl-client
// --partition). Text, regression targets and multi-label rows (float or multi-dimensional y)
// have no one class per example to split by: every example counts as class 0, which only the
// iid partition accepts (InvalidArgument naming federated.partition otherwise).
std::vector<std::vector<int64_t>> client_shards(const data::DataSplits& d,
                                                const data::PartitionSpec& ps);

}  // namespace krab::federated
