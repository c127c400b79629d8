#include "comm/factory.h"

#include "comm/backends/gloo/gloo_communicator.h"
#include "core/errors.h"
#ifdef KRAB_HAVE_MPI
#include "comm/backends/mpi/mpi_communicator.h"
#endif

namespace krab::comm {

const char* known_backends() { return "gloo, mpi"; }

std::unique_ptr<Communicator> make_communicator(const std::string& backend, const WorldInfo& world,
                                                const Options& options) {
  if (backend == "gloo") {
    const Endpoint at = world.rendezvous;
    const auto timeout = options.timeout;
    auto connect = [at, timeout] { return connect_store(at, timeout); };
    const std::string address = world.iface.empty() ? local_address_towards(at.host) : world.iface;
    return std::make_unique<GlooCommunicator>(connect, str_cat("g", world.generation, "/"),
                                              world.rank, world.size, world.generation, address,
                                              options);
  }
  if (backend == "mpi") {
#ifdef KRAB_HAVE_MPI
    return make_mpi_communicator(options, world.generation);
#else
    throw NotSupported("comm.backend 'mpi' is not compiled into this build (MPI was not found)");
#endif
  }
  throw InvalidArgument(
      str_cat("comm.backend: unknown backend '", backend, "' (known: ", known_backends(), ")"));
}

}  // namespace krab::comm
