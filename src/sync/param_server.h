// The parameter server's transport: a gRPC service around one ShardState, and the worker's
// client that talks to every shard at once.
//
// Protocol (sync/ps.proto): a worker calls Step on every shard in parallel, once per training
// step — the call carries the gradient of the step it just computed (nothing on the first
// call) and returns that shard's parameters for the next step, after the staleness wait, and
// server 0 adds the data slice to compute (a ticket). When the job's gradients are all in, the
// replies say `stop`; the worker's last call carries `leave` (and, to server 0, its summary).
// Server 0 (the chief)
// calls Finish on the other shards when its own workers are done, and assembles the model.
//
// Bytes on the wire per step and worker: the gradient up (4 bytes per parameter) and the
// parameters down (4 bytes per parameter), plus protobuf/gRPC framing. Both sides count the
// protobuf message sizes they send and receive (the meter the report uses).
//
// Who may call (issue 17): a server listens on the address its Access says — loopback for a
// one-node job, every interface only when workers on other nodes must reach it. Every call
// must carry the job secret in its "krab-job-secret" metadata; a call without it, or with
// another, is refused UNAUTHENTICATED before the shard sees it (Finish included: an outsider
// cannot make a server exit). The comparison takes the same time wherever the first wrong
// byte is. The channel is not encrypted: on a network an eavesdropper learns the secret (README
// "Running across machines safely"). A pushed gradient with a NaN or an infinity is refused
// (INVALID_ARGUMENT), and so is anything else the shard refuses; the reply's message is one
// fixed line per kind of refusal, never the shard's or another worker's state (clocks,
// versions, sizes): the details go to the server's stderr. A server accepts messages up to
// its shard's size plus 1 MiB; a shard too large for one message (2 GiB) is refused up front
// (use more servers).
//
// Mirrors (sync.replicas: 1, sync/replication.h): a server whose shard has a mirror answers a
// Step only once the mirror applied every record the answer depends on; a server that serves a
// mirror takes Mirror calls until its first Step or Finish, which promote it. A deposed primary
// answers Step with UNAVAILABLE, as a dead one would. The worker's client, given each shard's
// mirror address, sends a call that failed UNAVAILABLE again to the mirror (with a fresh
// comm.timeout_s) and talks to the mirror from then on; finish_shard() does the same.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sync/shard.h"

namespace krab::sync {

// Checks that a shard of `numel` floats fits one message; throws InvalidArgument naming
// sync.servers otherwise.
void check_shard_fits(int64_t numel, int servers);

// Where a server listens and what its callers must show.
struct Access {
  std::string host = "127.0.0.1";  // the address to listen on ("0.0.0.0": every interface)
  // The job secret every call must carry. "" accepts every caller: for tests only; krab's
  // launcher always has one.
  std::string secret;
};

class ParamServer {
 public:
  // Serves `state` on access.host:port (0 = a free port). Throws InvalidArgument when the port
  // is taken.
  // `replicator`: the shard's mirror link (its journal is state's); every Step answer waits up
  // to `ack_timeout` for the mirror.
  ParamServer(std::shared_ptr<ShardState> state, int port, Access access = {},
              std::shared_ptr<Replicator> replicator = nullptr,
              std::chrono::milliseconds ack_timeout = std::chrono::seconds(60));
  ~ParamServer();  // stops serving (in-flight calls are cancelled)
  int port() const;
  // Blocks until a Finish call was answered or `timeout` passed (false).
  bool wait_finish_answered(std::chrono::milliseconds timeout);
  uint64_t bytes_received() const;
  uint64_t bytes_sent() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct PullResult {
  bool stop = false;    // the job's work is done: leave() without computing another step
  int64_t ticket = -1;  // the data slice to compute next (from server 0; -1 if it gives none)
};

// Worker side. Not thread-safe: one training loop uses it.
class PsClient {
 public:
  // `addresses[i]` ("host:port") serves shard i of a model of `total_numel` parameters;
  // `mirrors[i]`, when given (sync.replicas: 1), serves its mirror. `timeout` bounds every
  // call (staleness waits included). Every call carries `secret`.
  PsClient(std::vector<std::string> addresses, int worker, int64_t total_numel,
           std::chrono::milliseconds timeout, std::string secret = "",
           std::vector<std::string> mirrors = {});
  ~PsClient();

  // First call: fills `params` (total_numel floats) with the current model (unless stop).
  PullResult pull(at::Tensor& params);
  // Pushes `grad` (total_numel floats) as this worker's next step and fills `params` for the
  // step after it (unless stop).
  PullResult push_pull(const at::Tensor& grad, at::Tensor& params);
  // Last push: the worker leaves; `summary` goes to server 0.
  void push_and_leave(const at::Tensor& grad, const WorkerSummary& summary);
  // Leaves without pushing (after a stop).
  void leave(const WorkerSummary& summary);

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }
  double wait_seconds() const { return wait_seconds_; }
  int failovers() const;  // shards this worker now reaches through their mirror

 private:
  PullResult call_all(const at::Tensor* grad, bool leave, const WorkerSummary* summary,
                      at::Tensor* params);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int worker_;
  int64_t clock_ = 0;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  double wait_seconds_ = 0;
};

struct FinalShard {
  at::Tensor values;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  int64_t version = 0;
  bool promoted = false;  // a mirror answered: the shard's primary was gone
};

// The chief's Finish call on the server at `address` (blocks until its workers are done); when
// that server is unreachable and `mirror` is given, on the mirror. CorruptData when the
// reply's values are not a whole number of float32 values.
FinalShard finish_shard(const std::string& address, std::chrono::milliseconds timeout,
                        const std::string& secret = "", const std::string& mirror = "");

// The primary's link to the mirror at `address` for Replicator: one Mirror call per batch,
// within `timeout`, carrying `secret`.
Replicator::Send mirror_sender(const std::string& address, std::chrono::milliseconds timeout,
                               const std::string& secret = "");

struct ShardSnapshot {
  at::Tensor values;
  int64_t version = 0, pushes = 0, replayed_seq = 0;
  std::vector<int64_t> clocks;
  bool mirror = false, promoted = false;
};

// The Snapshot call: the state of the shard served at `address`.
ShardSnapshot snapshot_shard(const std::string& address, std::chrono::milliseconds timeout,
                             const std::string& secret = "");

// The two ends of the protocol over serialised protobuf bytes, without gRPC: the same code the
// Step handler and finish_shard() run on the messages gRPC hands them, for tests and the
// fuzzers (tests/fuzz/). serve_step() takes a serialised StepRequest and returns the serialised
// StepReply; it throws CorruptData when the bytes do not parse, InvalidArgument for a request
// the shard refuses (the handler's INVALID_ARGUMENT), and whatever ShardState::step() throws
// (`cancelled` as there). decode_finish_reply() turns a serialised FinishReply into the
// FinalShard; CorruptData, starting with `who`, when it does not parse or its values are not
// float32s.
std::string serve_step(ShardState& state, const std::string& request,
                       const std::function<bool()>& cancelled);
FinalShard decode_finish_reply(const std::string& bytes, const std::string& who);

}  // namespace krab::sync
