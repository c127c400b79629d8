// Test support: run `fn(rank, communicator)` on `size` ranks that are threads of this process,
// joined by loopback Gloo through a store served here.
#pragma once

#include <chrono>
#include <thread>
#include <vector>

#include "comm/factory.h"
#include "comm/store.h"

namespace krab::testing {

// Like run_gloo_ranks, but hands each rank's communicator over: fn(rank, unique_ptr), for code
// that owns its group (the engines).
template <typename Fn>
void run_gloo_ranks_owned(int size, Fn fn) {
  using namespace std::chrono_literals;
  comm::StoreServer server("127.0.0.1", 0, 20s);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      comm::WorldInfo w;
      w.rank = r;
      w.size = size;
      w.rendezvous = comm::Endpoint{"127.0.0.1", server.port(), "", ""};
      comm::Options o;
      o.timeout = 20s;
      fn(r, comm::make_communicator("gloo", w, o));
    });
  for (auto& t : threads) t.join();
}

template <typename Fn>
void run_gloo_ranks(int size, Fn fn) {
  run_gloo_ranks_owned(size, [&fn](int r, std::unique_ptr<comm::Communicator> c) { fn(r, *c); });
}

}  // namespace krab::testing
