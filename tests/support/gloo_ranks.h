// Test support: run `fn(rank, communicator)` on `size` ranks that are threads of this process,
// joined by loopback Gloo through a store served here.
#pragma once

#include <chrono>
#include <thread>
#include <vector>

#include "comm/factory.h"
#include "comm/store.h"

namespace krab::testing {

template <typename Fn>
void run_gloo_ranks(int size, Fn fn) {
  using namespace std::chrono_literals;
  comm::StoreServer server("127.0.0.1", 0, 20s);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      comm::WorldInfo w;
      w.rank = r;
      w.size = size;
      w.rendezvous = {"127.0.0.1", server.port()};
      comm::Options o;
      o.timeout = 20s;
      auto c = comm::make_communicator("gloo", w, o);
      fn(r, *c);
    });
  for (auto& t : threads) t.join();
}

}  // namespace krab::testing
