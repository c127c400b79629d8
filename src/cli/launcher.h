// Process model of `krab train`: who spawns whom and how ranks are numbered.
//
// Three ways to be started:
//  1. Plain `krab train JOB.yaml` (or with --nnodes/--node-rank/--nproc-per-node/--rdzv, like
//     torchrun): this process is the *launcher*. Node 0's launcher hosts the rendezvous store;
//     each launcher spawns its local workers (re-executing this binary) with torchrun-style
//     RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
//     KRAB_WORKER=1, then watches them: the first worker that fails makes the launcher stop
//     the others (SIGTERM, then SIGKILL after a grace period), name the rank, and exit non-zero.
//     Workers die with their launcher (PR_SET_PDEATHSIG), so nothing is left behind.
//     One node: the store is a FileStore in a private directory (KRAB_STORE_FILE), and the
//     launcher makes a random job secret (KRAB_JOB_SECRET); several nodes: the secret comes
//     from the user (comm/store.h, README "Running across machines safely"). Both travel in
//     the workers' environment, never on a command line.
//  2. As a worker of (1): KRAB_WORKER=1; or, for sync.mode async, as one of node 0's
//     parameter servers: KRAB_WORKER=1 and KRAB_PS_SHARD=i.
//  3. Under another launcher: torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), mpirun
//     (OMPI_COMM_WORLD_RANK/SIZE) or Slurm (SLURM_PROCID/SLURM_NTASKS): this process is one
//     worker; rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"
#include "elastic/autoscale.h"
#include "elastic/keeper.h"
#include "elastic/providers/slurm.h"

namespace krab::elastic {
class EtcdRendezvous;
}

namespace krab::cli {

struct LaunchFlags {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 0;       // 0 = parallel.workers / nnodes
  std::string rdzv;             // HOST:PORT; "" = 127.0.0.1 with a free port (single node only)
  std::string job_secret_file;  // --job-secret-file: the job secret, shared by every node
  // --join HOST:PORT: this machine joins a running elastic job whose node 0 hosts its store
  // there; the job gives it its node number (plan.node_rank is -1 until then) and world.
  std::string join;
  // --rdzv-backend c10d (node 0's TCPStore at --rdzv keeps the membership) or etcd (the
  // membership lives in etcd at --rdzv-endpoints; elastic/etcd_rendezvous.h).
  std::string rdzv_backend = "c10d";
  std::string rdzv_endpoints;
};

enum class Role { kLauncher, kWorker };

// elastic.enabled on one node (docs/design/elastic.md §6.1): the launcher is the keeper of the
// membership. Each worker gets KRAB_MEMBER_ID=<node>.<slot>.0; the Supervisor publishes
// generation 0 (members in rank order, their pids) into the job's FileStore (LaunchPlan::
// rendezvous: file and secret) right after spawning, hands every exit to an
// elastic::LocalKeeper instead of stopping the run, polls it every 100 ms (heartbeats,
// progress, suspects), and on each new generation prints one line, SIGKILLs the lost members
// still running (a frozen one) and rewrites RUN_DIR/workers.json.
struct ElasticLaunch {
  elastic::KeeperOptions keeper;
  std::string store_dir;  // where generation g >= 1's store files go (the private directory)
  std::string run_dir;    // RUN_DIR: workers.json
  // parallel.zero_stage > 0: a stopped run leaves no checkpoint of its last step (each worker
  // holds one shard, and the group is gone): the stop message says so.
  bool sharded = false;
  std::chrono::milliseconds start_grace{60000};  // comm.timeout_s: generation 0's first beats
  // elastic.replace_dead: a worker that dies is respawned in its slot as a new member (the next
  // incarnation, KRAB_ELASTIC_JOIN=1) that joins at a step boundary and receives the state;
  // at most max_restarts times per slot.
  bool replace_dead = false;
  int max_restarts = 3;
  // elastic.autoscale.provider local or slurm: the policy's options (elastic/autoscale.h).
  std::optional<elastic::AutoscaleOptions> autoscale;
  // Across machines: the machines at the start (--nnodes). Node 0's launcher keeps the
  // membership of all of them in its TCPStore, reads what the other launchers report
  // (elastic/node_requests.h) and answers machines that ask to join with `admit` (see
  // elastic::LocalKeeperOptions::admit). Every other launcher is an `agent` (cli/node_agent.h)
  // for its own workers; `joining`: this machine joins a running job (--join), and every
  // worker it starts is a joiner.
  int nodes = 1;
  bool agent = false;
  bool joining = false;
  std::function<std::string(const std::string& fingerprint, int node)> admit;
  // --rdzv-backend etcd (elastic/etcd_rendezvous.h): this machine's part in the rendezvous.
  // The records live in etcd; node 0 leads from the start (its keeper's groups are built in
  // its store at plan.rendezvous); another machine campaigns once the leader's lease is gone
  // and, when it wins, takes the membership over with a store of its own. The workers get the
  // endpoints and the run id (KRAB_RDZV_ENDPOINTS, KRAB_RDZV_RUN).
  std::shared_ptr<elastic::EtcdRendezvous> etcd;
  std::string etcd_endpoints;
  std::string own_address;  // this machine's address towards etcd (a taken-over store's host)
  // provider slurm: how to reach Slurm (elastic/providers/slurm.h); empty for local. The
  // launcher adds a worker through the provider (elastic/providers/provider.h): local spawns
  // it as its child, slurm submits it as a batch job that joins through the same store file;
  // at the end of the run the provider ends every job it submitted.
  std::optional<elastic::SlurmOptions> slurm;
};

struct LaunchPlan {
  Role role = Role::kLauncher;
  int world_size = 1;
  int rank = 0;  // worker role
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  comm::Endpoint rendezvous;
  bool host_store = false;  // this process hosts the TCPStore
  // sync.mode async: node 0's launcher also starts this many parameter servers
  // (KRAB_PS_SHARD=i in their environment), and a worker that dies does not stop the run
  // (unless it was the last one, or it failed on bad input, exit 2).
  int servers = 0;
  bool tolerate_worker_loss = false;
  // sync.replicas: 1. A parameter server other than 0 (the chief) that dies does not stop the
  // run: its shard's mirror on the next server answers for it. A second one does (two dead
  // servers may be a shard and its mirror).
  bool tolerate_server_loss = false;
  int ps_shard = -1;                     // worker role: this process is parameter server `ps_shard`
  std::optional<ElasticLaunch> elastic;  // see ElasticLaunch
  // Extra variables for the workers' environment, added unless the launcher's own environment
  // already sets them (the user's choice wins).
  std::map<std::string, std::string> worker_env;
  // monitor.port > 0: where the workers keep their snapshots for the node's endpoint
  // (KRAB_MONITOR_DIR; cli/node_monitor.h); "" otherwise.
  std::string monitor_dir;
  // --trace: the launcher's private directory where each worker writes its part of the
  // timeline (KRAB_TRACE_PART=<dir>/rank-<r>.jsonl, or rank-<r>-<member>.jsonl in an elastic
  // run, whose replacements share a slot's rank); "" without --trace.
  std::string trace_dir;
};

// Decides the role from the flags, the job's parallel.workers and the environment. Pure;
// throws InvalidArgument naming the flag or variable at fault.
LaunchPlan plan_launch(const LaunchFlags& flags, int config_workers,
                       const std::map<std::string, std::string>& env);

std::map<std::string, std::string> current_environment();

// Spawns plan.nproc_per_node workers running `argv` (the worker command line), supervises
// them, and returns the exit code for the launcher: 0 when all succeeded; otherwise the first
// failing worker's code (2 for bad input) or 1, after stopping the others.
// With plan.elastic: a worker killed or failing (exit status other than 0 and 2) is a change of
// membership, not a stop; exit 2 still stops everything (2). Returns 0 when every member of the
// last generation exited 0; 1 when none is left or a record said stop (below
// elastic.min_workers for elastic.wait_s; the workers write a checkpoint and exit first).
int spawn_and_supervise(const LaunchPlan& plan, const std::vector<std::string>& argv,
                        double grace_seconds);

}  // namespace krab::cli
