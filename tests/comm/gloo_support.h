// What the Gloo tests share: joining a group as one rank (thread-ranks over a loopback
// TCPStore), and re-executing this test binary as a child process (for a peer that really
// dies or freezes). Header-only; included by the Gloo test files of comm_gloo_test.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/factory.h"
#include "comm/store.h"

extern char** environ;

namespace krab::comm::test_support {

// Joins group `generation` ("g<generation>/" in the store at 127.0.0.1:port) as `rank` of
// `size` over Gloo.
inline std::unique_ptr<Communicator> join(int rank, int size, int port, const Options& options,
                                          int64_t generation = 0) {
  WorldInfo w;
  w.rank = rank;
  w.size = size;
  w.rendezvous.host = "127.0.0.1";
  w.rendezvous.port = port;
  w.generation = generation;
  return make_communicator("gloo", w, options);
}

inline std::unique_ptr<Communicator> join(int rank, int size, int port,
                                          std::chrono::milliseconds timeout, bool debug = false) {
  Options o;
  o.timeout = timeout;
  o.debug_checks = debug;
  return join(rank, size, port, o);
}

// Runs fn(rank, comm) on `size` threads, each with its own communicator built with `options`.
template <typename Fn>
void run_ranks_with(int size, const Options& options, Fn fn) {
  StoreServer server("127.0.0.1", 0, options.timeout);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      auto comm = join(r, size, server.port(), options);
      fn(r, *comm);
    });
  for (auto& t : threads) t.join();
}

template <typename Fn>
void run_ranks(int size, Fn fn, std::chrono::milliseconds timeout = std::chrono::seconds(20),
               bool debug = false) {
  Options o;
  o.timeout = timeout;
  o.debug_checks = debug;
  run_ranks_with(size, o, fn);
}

inline std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return std::string(buf, n > 0 ? n : 0);
}

// Starts this binary with `args` (args[0] is the program); main() dispatches on args[1].
inline pid_t spawn_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

// Child entry points (the test binary's main() calls them).
int child_deadpeer(int rank, int size, int port);
// gloo_abort_test.cpp: one rank of the rebuild test; `victim` is killed or frozen by the parent.
int child_rebuild(int rank, int size, int port, int victim, bool freeze);

}  // namespace krab::comm::test_support
