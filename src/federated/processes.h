// `krab fl-server` and `krab fl-client`: the federation as separate processes over gRPC + TLS.
//
// The server owns the global model and never sees a client's data: it evaluates only on its
// own held-out split (federated.eval_data), sends each sampled client the global parameters,
// and gets back an update of the model's size (or, with secure aggregation, masked vectors of
// that size). The client takes from the server's Hello only the model's architecture and the
// training recipe (server_job.h: never a path), gets each round's privacy settings with the
// task (checked against its own policy, client_policy.h), loads its own data from --data, and
// trains; a TorchScript model is the client's own --model file, with the server's digest.
//
// Server run: listen (transport.h) -> wait up to federated.wait_clients_s for
// federated.clients clients (at least federated.min_clients) -> federated.rounds rounds of
// RoundRunner (rounds.h), one thread per sampled client, each task bounded by
// federated.round_deadline_s -> DONE to every client -> model.pt and the report. After every
// round the state goes to <checkpoint.dir>/fl-state.krab; with checkpoint.resume a restarted
// server continues from the last complete round and clients that are still running carry on.
// Report: the round records (rounds.h) plus the transport's measured bytes in and out and the
// refused calls (bad or expired tokens, wrong model).
//
// Client run: Hello -> the job (server_job.h: the server's listed keys, refused if it sets
// any other) -> build the model and check its signature ->
// Ready -> loop over tasks until DONE. A task that fails (bad data, a refused secure
// aggregation request) is answered with the error, so the server drops this client from the
// round at once instead of waiting for the deadline. When the server is unreachable the client
// retries for `retry_s` before giving up (exit 1). A refused token or a model mismatch is exit 2.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "federated/client_policy.h"

namespace krab::federated {

struct RoundRecord;

struct ServerRunOptions {
  std::string report_path;  // "" = none
  std::string port_file;    // "" = none; else the bound port, written once listening
  bool show_progress = true;
  // Called on the server's thread after each round, once its checkpoint is saved (the
  // monitoring endpoint's numbers, cli/node_monitor.h); empty = nobody.
  std::function<void(const RoundRecord&)> on_round;
};

nlohmann::json run_fl_server(const core::Config& config, const ServerRunOptions& options);

struct ClientRunOptions {
  std::string server;               // HOST:PORT
  std::string ca_file;              // the CA that signed the server's certificate
  std::string cert_file, key_file;  // optional client certificate
  std::string server_name;          // the name the server's certificate carries, if not HOST
  std::string token;  // resolve_client_token (tls_files.h): --token-file, KRAB_FL_TOKEN, --token
  std::string data;   // the client's data: a dataset path (data.path); "" = the default
  std::string model;  // the client's own TorchScript module (--model), when the server's is one
  std::string partition;  // "K/N": use partition K of N of that data (experiments); "" = all
  double retry_s = 60;
  int threads = 1;
  ClientPolicy policy;  // what this client insists on (client_policy.h)
};

// Returns the number of rounds this client took part in.
int64_t run_fl_client(const ClientRunOptions& options);

}  // namespace krab::federated
