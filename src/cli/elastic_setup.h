// What `krab train` sets up for elastic.enabled before it spawns anything (docs/design/
// elastic.md §6, §7, §8): the launcher's ElasticLaunch from the job's keys, and the steps of
// `--join HOST:PORT`, by which a machine enters a running job across machines.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "cli/job_agreement.h"
#include "cli/launcher.h"
#include "core/config.h"

namespace krab::cli {

// The launcher's elastic part. `store_dir`: where generation g >= 1's store files go (one
// machine); `workers`: the starting world. With `nodes` > 1, node 0 (`node_rank` 0) keeps the
// membership and admits joining machines whose job matches `mine` (without geometry); the
// other launchers are agents. Refuses (InvalidArgument) what elastic/providers refuse.
ElasticLaunch elastic_launch(const core::Config& config, std::chrono::milliseconds timeout,
                             const std::string& store_dir, int workers, int nodes, int node_rank,
                             const Fingerprint& mine);

// `--join HOST:PORT` (plan.rendezvous, with the job secret): finds the running job there, asks
// it to admit this machine with `mine` (its job fingerprint) and fills in `plan`: the node
// number the job gave it and the starting world (generation 0's size, which fixes the global
// batch). Refusals are InvalidArgument (exit 2), naming --join: nothing answers there within
// `timeout`; no job under this secret; the job differs (the first differing key).
void join_running_job(LaunchPlan& plan, const Fingerprint& mine, std::chrono::milliseconds timeout);

// --rdzv-backend etcd (elastic/etcd_rendezvous.h), before the job agreement: checks that etcd
// answers (else InvalidArgument, exit 2, naming --rdzv-endpoints), joins the run, and on node
// 0 hosts the first store at this machine's address towards etcd and announces it; on the
// others reads it. Sets plan.rendezvous (the job secret must be set in it already).
struct EtcdSetup {
  std::shared_ptr<elastic::EtcdRendezvous> rendezvous;
  std::unique_ptr<comm::StoreServer> server;  // node 0: the first store
  std::string own_address;
};
EtcdSetup join_etcd_rendezvous(LaunchPlan& plan, const std::string& endpoints, double lease_s,
                               std::chrono::milliseconds timeout);

}  // namespace krab::cli
