// How the round loop calls its participants; internal to rounds.cpp and secure_round.cpp.
//
// A round's stages call every participant of the stage and never let one participant's failure
// escape: it becomes a reason string in the round's record (the participant is dropped).
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace krab::federated {

// Calls fn(i) for i in [0, n): in this thread, or one thread each.
template <typename Fn>
void for_each_index(size_t n, bool parallel, Fn fn) {
  if (!parallel || n < 2) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (auto& t : threads) t.join();
}

// The reason a call failed, for the record ("" when it did not); any exception counts as a
// dropout.
template <typename Fn>
std::string try_call(Fn fn) {
  try {
    fn();
    return "";
  } catch (const std::exception& e) {
    return e.what()[0] != '\0' ? e.what() : "failed";
  }
}

}  // namespace krab::federated
