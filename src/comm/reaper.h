// Reaper: destroys abandoned communicators off the training thread.
//
// When the membership of an elastic run changes, the group of the old generation is aborted
// (Communicator::abort) and replaced. It cannot simply be destroyed on the training thread:
// destroying a Gloo group waits until c10d's worker thread has finished the op it is in, and
// an op blocked on a peer that froze (SIGSTOP, a cut link) ends only at Gloo's own timeout,
// Options::timeout — up to a minute during which the new group could already be training.
// bury() hands the group to one background thread per Reaper instead, which destroys the
// groups one after the other, in the order they were buried. Measured (design elastic §15.1):
// after a peer's death the destruction takes 0.01-0.03 s; after a freeze it ends at Gloo's
// timeout, while the next generation's group, built meanwhile in the same process, already ran.
//
// A buried group keeps the tensors its pending ops were given alive, and those ops may still
// write into them until the group is gone: they must not be the model's state (design elastic
// invariant 3).
//
// Lifetime: the thread starts at the first bury(). The destructor (at process exit for
// Reaper::process()) lets the thread finish what was buried, waiting at most the exit bound:
// by default kExitBound, 1 s. A group abandoned after a peer's death is gone in 0.01-0.03 s,
// well within it. One whose op waits on a peer that froze or whose machine was cut off (no
// FIN or RST ever arrives) ends only at Gloo's timeout, comm.timeout_s: a worker that waited
// for it at the end of its run would leave up to that long after it finished, silent all the
// while (its group, and so its heartbeats, are gone), and its keeper would count it dead after
// elastic.dead_after_ms (3 s) and start it again. If the bound passes, it prints one warning
// line on stderr and leaves the thread running (detached) rather than hang the exit — the
// caller's state was written before; the process is leaving.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <thread>

#include "comm/communicator.h"

namespace krab::comm {

class Reaper {
 public:
  static constexpr std::chrono::milliseconds kExitBound{1000};

  // `exit_bound`: how long the destructor waits for the thread.
  explicit Reaper(std::chrono::milliseconds exit_bound = kExitBound);
  ~Reaper();
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  // Takes `comm` (abort it first if its ops may be pending) and returns at once; the reaper's
  // thread destroys it. A null pointer is ignored.
  void bury(std::unique_ptr<Communicator> comm);

  // Groups buried and not yet destroyed (including the one being destroyed now).
  size_t pending() const;

  // Blocks until pending() is 0 or `timeout` passed; returns whether it reached 0. For tests
  // and for callers that want to bound what is left behind.
  bool wait_idle(std::chrono::milliseconds timeout) const;

  // The process-wide reaper, destroyed (joined, within its bound) at process exit.
  static Reaper& process();

 private:
  struct State;
  // The thread's loop.
  static void reap(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;  // shared with the thread, which may outlive *this (detached)
  std::chrono::milliseconds exit_bound_;
  std::thread thread_;  // started by the first bury(), under state_'s mutex
};

}  // namespace krab::comm
