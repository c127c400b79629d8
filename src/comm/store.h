// Rendezvous store: how workers find each other.
//
// krab rendezvous goes through one key/value store. One process hosts it (the launcher on
// node 0, or rank 0 when workers were started by torchrun-style environment variables); every
// worker connects a client. Groups build their keys under a generation prefix
// ("g<generation>/..."), so a group rebuilt after a membership change never sees the keys of
// the one before it.
//
// Which store, and who can reach it:
//  - One node (krab's launcher, --nnodes 1): a c10d FileStore in a directory only this user
//    can read (Endpoint::file). It is on no network at all. A TCPStore would not do: torch
//    1.13's TCPStore listens on every interface whatever host it is given.
//  - Several nodes: c10d's TCPStore on --rdzv's port, reachable by anyone who can reach that
//    port, with plain-text traffic. With a job secret (Endpoint::secret) every key lives under
//    a prefix derived from the secret (a SHA-1 of it, which does not reveal it): a process that
//    does not know the secret cannot name, read or overwrite the job's keys, and a node started
//    without it (or with another one) never finds node 0's. What it does not stop: someone who
//    can read the traffic learns the prefix; anyone can fill the store's memory or connect
//    until the server's sockets run out. Run multi-node jobs on a trusted network (as PyTorch
//    asks for its store and Gloo ports); README "Running across machines safely".
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace c10d {
class TCPStore;
}

namespace krab::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

struct Endpoint {
  std::string host;
  int port = 0;
  // Not "" (one-node jobs): the store is the c10d FileStore at this path; host and port are
  // not used for it.
  std::string file;
  // Not "": the job secret. Every key goes under a prefix derived from it (see above), and the
  // parameter servers (sync.mode async) require it on every call.
  std::string secret;
  std::string to_string() const;  // "HOST:PORT", or "file PATH"; never the secret
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& host);

// Parses "HOST:PORT" (IPv4, a hostname, or "[v6]:PORT"). `what` names the option in errors,
// e.g. "--rdzv". Throws InvalidArgument on a malformed value or a port outside 1..65535.
Endpoint parse_endpoint(const std::string& text, const std::string& what);

// Hosts the store for the lifetime of the object.
class StoreServer {
 public:
  // A TCPStore server on host:port (it listens on every interface: torch 1.13 ignores host);
  // port 0 picks a free port (see port()). A port already in use throws InvalidArgument naming
  // it. Keys go under `secret`'s prefix when it is not "".
  StoreServer(const std::string& host, int port, std::chrono::milliseconds timeout,
              const std::string& secret = "");
  // A FileStore at `at.file` (created, mode 0600, if absent), under `at.secret`'s prefix.
  explicit StoreServer(const Endpoint& at);
  ~StoreServer();
  int port() const;  // 0 for a FileStore
  // A client-side handle on this store (shares the server's connection).
  StorePtr store() const;

 private:
  c10::intrusive_ptr<c10d::TCPStore> tcp_;
  StorePtr store_;
};

// Connects a new client to the store at `at` (its file when `at.file` is set), waiting up to
// `timeout` for a TCP server. Failure throws krab::Timeout naming the endpoint.
StorePtr connect_store(const Endpoint& at, std::chrono::milliseconds timeout);

// A client of the TCPStore at `at` that outlives a broken link: connected now as connect_store
// does (failure throws Timeout), and again on the next call after any call failed. Each call
// still fails as c10d's client fails it (the error propagates, bounded by `timeout`); what
// changes is what comes after. c10d's client gives up on an answer that does not arrive in time
// but keeps its socket: once a cut link returns, that connection moves again only at TCP's next
// retransmission, seconds later after a long cut (tests/net/elastic_partition.sh: the cut
// machine rejoined 22 s after a 10 s cut with its first connection kept, 10.5 s with a new
// one), and the late answer to the abandoned call could be read as the answer to the next one.
// A new connection has neither problem; a caller that polls (the elastic membership view, a
// machine's agent) simply calls again. A file endpoint gets connect_store's client: a local
// file has no link to lose. Thread safety: calls are serialised.
StorePtr reconnecting_store(const Endpoint& at, std::chrono::milliseconds timeout);

// Wraps `base` so every key is prefixed with `prefix`.
StorePtr prefixed(const std::string& prefix, StorePtr base);

// The local IPv4 address that routes to `host` (no packet is sent: a UDP socket is connected
// and asked for its own address). Inside a network namespace this is the namespace's own
// interface address, unlike the hostname, which resolves to 127.0.0.1 there.
std::string local_address_towards(const std::string& host);

}  // namespace krab::comm
