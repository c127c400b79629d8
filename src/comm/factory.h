// make_communicator(): the one place a backend name becomes a Communicator.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/store.h"

namespace krab::comm {

// Where this process sits in the world and how to reach the rendezvous store.
struct WorldInfo {
  int rank = 0;
  int size = 1;
  Endpoint rendezvous;     // the TCPStore (unused by mpi, which has its own launcher)
  std::string iface;       // Gloo: interface name or local IPv4; "" = towards rendezvous host
  int64_t generation = 0;  // membership generation the group is built at
};

// Known backend names, for messages and docs.
const char* known_backends();

// Builds the group; blocks until all `size` ranks have joined or options.timeout passes
// (krab::Timeout naming the ranks that did not arrive). Unknown backend -> InvalidArgument
// listing the known ones; a backend missing from this build -> NotSupported.
std::unique_ptr<Communicator> make_communicator(const std::string& backend, const WorldInfo& world,
                                                const Options& options);

}  // namespace krab::comm
