// What a federated client takes from its server's job, and what it never does.
//
// fl-server sends every client the job in its Hello (processes.h). A client that ran that job as
// given would let the server choose what the client reads: `model.path` (a TorchScript file is
// a program, and it runs in the client), `data.path` when the client gave no --data (any file
// the client's user can read: it would be trained on, and so partly revealed by the updates),
// the tokenizer, the cache sizes... So a client takes from its server only the keys of
// server_job_keys() — the model's architecture and the training recipe, which every client must
// share for the average of their updates to mean anything — and nothing else: every other key
// keeps its registry default, and the client's own command line gives the rest (--data,
// --model). A server job that sets any other key is refused, naming every such key
// (InvalidArgument, exit 2). An honest server of this version sends exactly the listed keys
// (job_for_clients), so anything else is a server of another version, or one that tries to
// steer its clients. No path is, or may ever be, on the list.
//
// The round's privacy settings (clipping, local noise, secure aggregation and its threshold) do
// not travel in the job: they come with each task and meet the client's own policy
// (client_policy.h).
//
// TorchScript: the module's code runs in the client, so the client must hold the file itself
// (`krab fl-client --model FILE`). The server states the SHA-256 of its own copy in Hello; a
// client whose file has another digest, or whose server states none, refuses to start (exit 2,
// naming both digests). The module is then loaded as any model file is (docs/models.md).
//
// All of this protects a client against a server that lies in its job. It cannot protect against
// a server that is honest about the job and malicious in its rounds beyond what the client's
// policy flags check (client_policy.h); see docs/security.md.
//
// Pure apart from reading the named files; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace krab::federated {

// The keys a client takes from its server, in registry order (the single list; docs/federated.md
// prints it).
const std::vector<std::string>& server_job_keys();

// Server side: the listed keys of `config` as a YAML document (a JSON object, which YAML
// parses), the job every client is sent.
std::string job_for_clients(const core::Config& config);

// What a client decides for itself.
struct LocalJob {
  std::string
      data;  // --data: data.path; "" = the registry default (data.name synthetic reads none)
  std::string model;  // --model: the TorchScript module; required when the server's model is one
};

// Client side: the job the client runs. Parses the server's YAML (`server_yaml`), refuses it when
// it sets a key outside server_job_keys() (InvalidArgument naming every such key),
// and returns the registry defaults with the server's listed keys and the client's own `local`
// choices. With model.name torchscript: `local.model` must be given and its SHA-256 must equal
// `server_model_sha256` (hex), else InvalidArgument naming --model and both digests; without
// it, a `local.model` is refused as meaningless.
core::Config client_job(const std::string& server_yaml, const std::string& server_model_sha256,
                        const LocalJob& local);

// The SHA-256 of a file's bytes, 64 lower-case hex digits. InvalidArgument naming `what` and
// the path when the file cannot be read.
std::string file_sha256(const std::string& path, const std::string& what);

}  // namespace krab::federated
