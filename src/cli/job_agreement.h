// Nodes that disagree about the job fail before training, not in the middle of it.
//
// Every node runs `krab train` with its own job file and flags. If node 1 says train.steps 20
// and node 0 says 30, both would train with different settings until a collective finds the
// other side gone (Gloo's EnforceNotMet, signal 6). So at rendezvous every node's launcher
// publishes a fingerprint of what it is about to run, and every node compares it with node 0's:
//
//   1. node 0 (which hosts the store) sets  job/0 = its fingerprint;
//   2. node n > 0 waits for job/0, reads it, then sets job/n = its own (reading first means
//      node 0, which leaves as soon as it has seen a difference, never leaves before node n
//      has what it needs);
//   3. node 0 waits for job/1 .. job/(nnodes-1) and compares each with its own; node n
//      compares its own with job/0. A difference makes every node that sees it (node 0 and
//      the node that differs) exit 2 with the same line, naming the first differing key:
//        node 1's job differs from node 0's at key train.steps: '20' vs '30'
//      Each node also claims its --node-rank with an atomic counter, so two nodes started
//      with the same --node-rank are refused too.
//
// The fingerprint is every resolved job key (core::Config, defaults included, in registry
// order), the launch geometry (--nnodes, workers per node) and the binary (version and a hash
// of the executable). Left out, because they may rightly differ from node to node:
//   name, checkpoint.dir  only rank 0 (on node 0) writes checkpoints, model.pt and the report;
//   checkpoint.hmac_key_file  likewise: where node 0 keeps its sealing key is its own path;
//   data.path, data.test_path  where a node keeps its copy of the data set is its own business;
//   comm.iface            each machine has its own network interfaces;
//   train.threads_per_worker  machines may have different numbers of cores.
// Files that shape the model itself (model.path, data.tokenizer.sentencepiece) are compared by
// content (SHA-256 and the size), not by path: each node may keep them where it likes, but two
// nodes training different TorchScript modules or tokenizers are refused. The executable's
// digest is SHA-256 too. The comparison catches mistakes, and the hash being cryptographic, no
// one can craft a different file that passes for the same one (64 bits of FNV-1a, used before,
// can be matched at will). It is not authentication: a node that lies about its own files can
// present node 0's fingerprint while running something else, since each node reports on itself.
// Data files are not hashed (they may be terabytes, and each node may rightly read its own shards).
// Workers started by torchrun, mpirun or Slurm have no krab launcher and are not compared.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/store.h"
#include "core/config.h"

namespace krab::cli {

// (key, value as text) pairs; see the header comment for what is in it.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

// The fingerprint of `config` launched as `nnodes` nodes of `per_node` workers by this binary.
Fingerprint job_fingerprint(const core::Config& config, int nnodes, int per_node);

// `f` without the launch geometry (--nnodes, workers per node): what a machine joining an
// elastic run must share with node 0 (the membership may rightly change the geometry).
Fingerprint without_geometry(const Fingerprint& f);

// Keys left out of the fingerprint, for docs and tests.
const std::vector<std::string>& per_node_keys();

// File-valued keys whose file's content, not path, is in the fingerprint.
const std::set<std::string>& content_keys();

// Text form for the store (one "key\tvalue" line per entry) and back.
std::string encode(const Fingerprint& f);
Fingerprint decode(const std::string& text);

// "" when equal; otherwise the line above for node `node` against node 0. Pure.
std::string first_difference(const Fingerprint& node0, const Fingerprint& theirs, int node);

// Where node 0 writes what rank 0 produces, so the other nodes can say where to look.
struct Node0Outputs {
  std::string run_dir;  // node 0's checkpoint.dir (absolute)
  std::string report;   // node 0's --report (absolute), "" if none
};

// The exchange of steps 1-3 through `store` (the rendezvous store, unprefixed: keys go under
// "krab/"). Node 0 passes its `outputs` along with its fingerprint; every node gets node 0's
// back. Blocks up to `timeout` for the other nodes. Throws InvalidArgument (exit 2) on a
// difference or a duplicate --node-rank, Timeout (exit 1) naming the nodes that never came and
// `rendezvous` when they do not arrive in time.
Node0Outputs agree_on_job(const comm::StorePtr& store, int node_rank, int nnodes,
                          const Fingerprint& mine, const Node0Outputs& outputs,
                          const comm::Endpoint& rendezvous, std::chrono::milliseconds timeout);

}  // namespace krab::cli
