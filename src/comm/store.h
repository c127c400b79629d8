// Rendezvous store: how workers find each other.
//
// krab rendezvous goes through one key/value store, c10d's TCPStore. One process hosts the
// server (the launcher on node 0, or rank 0 when workers were started by torchrun-style
// environment variables); every worker connects a client. Groups build their keys under a
// generation prefix ("g<generation>/..."), so a group rebuilt after a membership change never
// sees the keys of the one before it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace c10d {
class TCPStore;
}

namespace krab::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

struct Endpoint {
  std::string host;
  int port = 0;
  std::string to_string() const;
};

// Parses "HOST:PORT" (IPv4, a hostname, or "[v6]:PORT"). `what` names the option in errors,
// e.g. "--rdzv". Throws InvalidArgument on a malformed value or a port outside 1..65535.
Endpoint parse_endpoint(const std::string& text, const std::string& what);

// Hosts a TCPStore server for the lifetime of the object.
class StoreServer {
 public:
  // Binds host:port; port 0 picks a free port (see port()). A port already in use throws
  // InvalidArgument naming it.
  StoreServer(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreServer();
  int port() const;
  // A client-side handle on this server (shares the server's connection).
  StorePtr store() const;

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

// Connects a new client to the store at `at`, waiting up to `timeout` for the server. Failure
// throws krab::Timeout naming the endpoint.
StorePtr connect_store(const Endpoint& at, std::chrono::milliseconds timeout);

// Wraps `base` so every key is prefixed with `prefix`.
StorePtr prefixed(const std::string& prefix, StorePtr base);

// The local IPv4 address that routes to `host` (no packet is sent: a UDP socket is connected
// and asked for its own address). Inside a network namespace this is the namespace's own
// interface address, unlike the hostname, which resolves to 127.0.0.1 there.
std::string local_address_towards(const std::string& host);

}  // namespace krab::comm
