// The federated transport: gRPC over TLS between `krab fl-server` and `krab fl-client`.
//
// The only seam to the network; fl.proto and gRPC's headers stay in transport.cpp. The server
// side turns each connected client into a Participant (rounds.h) whose calls become tasks the
// client pulls; the client side is a small stub over the four RPCs. See fl.proto for the
// protocol.
//
// Security. There is no plaintext mode: the server presents a certificate (PEM cert + key), and
// clients verify it against a CA file; with `client_ca` set the server also requires client
// certificates signed by that CA (mutual TLS). Each call carries a bearer token; the server
// maps it to a client name through the tokens file, refuses unknown and expired tokens with
// UNAUTHENTICATED (the client reports "token refused: ..." and exits 2), and counts every
// refusal. Tokens are checked on a call's headers, before gRPC reads its message (an
// AuthMetadataProcessor), so a stranger cannot make the server buffer large bodies; they are
// kept and compared as SHA-256 digests; under mutual TLS a token is accepted only with a client
// certificate whose common name is the token's client name. Each connection may have at most 4
// concurrent calls, and gRPC's buffers share one memory quota. A token belongs to one client at
// a time: Ready hands out a session that GetTask and
// Submit must carry, and a second Ready with a token whose holder is still polling is refused
// (TokenInUse), so a copied token can neither join twice nor take the holder's tasks. A message
// above `max_message_bytes` is refused by gRPC (RESOURCE_EXHAUSTED) before any of krab's code sees
// it; a task result that does not parse, has the wrong task id or an update of the wrong size drops
// that client from the round and is logged with its name. In every case the server goes on serving
// the other clients.
//
// Liveness. A Participant whose client has not polled for `liveness_s` is not offered to new
// rounds; a task not answered by the round deadline throws Timeout (the round counts the client
// as dropped); a client that comes back with the same token continues under the same name.
//
// Thread safety: FederationServer is safe to use from the round loop while gRPC's threads serve
// clients; each Participant it returns may be called by one thread at a time (as the round
// loop does). FederationClient is used by one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "federated/rounds.h"

namespace krab::federated {

// A Ready refused because another live client holds the same token (fl-client retries it for
// --retry-s, in case it is the same client restarted, then exits 2).
class TokenInUse : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct TokenInfo {
  std::string client;   // the client's name
  int64_t expires = 0;  // unix seconds; 0 = never
};

// Reads a tokens file: one client per line, "NAME TOKEN [EXPIRES]" (EXPIRES in unix seconds);
// blank lines and lines starting with '#' are skipped. TOKEN may be written as "sha256:HEX",
// the SHA-256 of the token (`printf %s TOKEN | sha256sum`), so the server's file never holds a
// token a thief could use. InvalidArgument naming the file and line for a malformed line, a
// duplicate name or token, a token shorter than 16 characters or a malformed digest.
std::map<std::string, TokenInfo> read_tokens(const std::string& path);

struct ServerTransportOptions {
  std::string address = "0.0.0.0:7070";  // port 0 picks a free one (see port())
  std::string cert_file, key_file;       // PEM; required
  std::string client_ca_file;            // PEM; non-empty: require client certificates
  std::map<std::string, TokenInfo> tokens;
  int64_t max_message_bytes = 64 << 20;
  std::string config_yaml;      // sent to clients by Hello
  std::string model_signature;  // Ready must match it
  std::string model_sha256;     // sent by Hello: the TorchScript module's digest, or ""
  std::chrono::milliseconds poll_timeout{2000};
  std::chrono::milliseconds liveness{10000};
  std::chrono::milliseconds deadline{60000};  // per task
};

struct TransportStats {
  int64_t bytes_in = 0, bytes_out = 0;  // task payloads and results
  int64_t refused_calls = 0;            // authentication failures
  std::vector<std::string> refusals;    // their reasons (most recent 100)
};

class FederationServer {
 public:
  // Starts serving. InvalidArgument naming the file for a missing or unreadable certificate or
  // key; Error when the address cannot be bound.
  explicit FederationServer(ServerTransportOptions options);
  ~FederationServer();

  int port() const;

  // Clients that are Ready and alive, in name order.
  std::vector<Participant*> available();

  // Waits until `n` clients are Ready, or `timeout` passes; returns how many are.
  size_t wait_for_clients(size_t n, std::chrono::milliseconds timeout);

  // Tells polling clients the federation is over (DONE) and stops serving after a grace period
  // in which they can fetch it.
  void finish(std::chrono::milliseconds grace);

  TransportStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ClientTransportOptions {
  std::string server;               // HOST:PORT
  std::string ca_file;              // PEM CA that signed the server's certificate
  std::string cert_file, key_file;  // optional client certificate (mutual TLS)
  std::string server_name;          // "" = the host of `server`; else the name to verify
  std::string token;
  int64_t max_message_bytes = 64 << 20;
  std::chrono::milliseconds timeout{30000};  // per call (GetTask adds the server's poll time)
};

struct RemoteTask {
  // kRejoin: the server does not know this client (it restarted): call ready() again.
  enum Kind { kWait = 0, kFit = 1, kSecAgg = 2, kDone = 3, kRejoin = 4 };
  Kind kind = kWait;
  uint64_t task_id = 0;
  FitInstruction fit;    // kFit (fit.global holds the parameters)
  SecAggRequest secagg;  // kSecAgg
};

class FederationClient {
 public:
  explicit FederationClient(ClientTransportOptions options);
  ~FederationClient();

  struct Hello {
    std::string client_name, config_yaml, model_signature, model_sha256;
  };
  // Each throws InvalidArgument for a refused token ("token refused: ..."), PeerLost when the
  // server cannot be reached or the TLS handshake fails (the message says which), Timeout.
  Hello hello();
  void ready(const std::string& model_signature, int64_t num_examples);
  RemoteTask next_task();
  void submit_fit(uint64_t task_id, const FitReply& reply);
  void submit_secagg(uint64_t task_id, const std::vector<uint8_t>& message);
  void submit_error(uint64_t task_id, const std::string& error);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace krab::federated
