// Provider: where an autoscaled run's extra workers come from (docs/design/elastic.md §8).
//
// The autoscale policy (elastic/autoscale.h) decides *whether* to add or remove a worker; a
// provider carries it out. The launcher's Supervisor owns one provider for the run:
//
//   handle = provider.add(spec)        the policy said add: start one worker that will ask to
//                                      join (KRAB_ELASTIC_JOIN=1 in spec.env)
//   provider.remove(handle)            the policy said remove: the newest member's graceful
//                                      leave (SIGTERM to the worker: it finishes its step,
//                                      asks to leave, and exits 0)
//   provider.kill(handle)              the keeper dropped the member (no heartbeat): it must
//                                      not come back
//   provider.capacity()                how many more workers could start now (the policy adds
//                                      only when it is >= 1)
//   for h in provider.poll():          additions that will never join (a job pending longer
//     keeper.addition_failed(h.member)  than elastic.wait_s, cancelled; a job that ended first)
//   provider.shutdown()                the run is over: nothing the provider started is left
//
// Implementations: `local` (providers/local.h: a process of this launcher, forked by it) and
// `slurm` (providers/slurm.h: a one-task batch job). A worker's death is seen by the keeper
// either way — the launcher's waitpid for local ones, heartbeats (elastic.dead_after_ms) for
// the others, which are not the launcher's children.
//
// Errors: add() throws krab::Error naming the command that failed and its message (the
// launcher then tells the policy the proposal failed); remove(), kill() and shutdown() are best
// effort and never throw (the worker may be gone already). Every call is bounded in time.
// Thread safety: none; the Supervisor's thread owns the provider.
#pragma once

#include <string>
#include <vector>

#include "elastic/generation.h"

namespace krab::elastic {

// One worker to start: the member it will be, its command line and its whole environment.
struct WorkerSpec {
  MemberId member;                // also in env as KRAB_MEMBER_ID
  std::vector<std::string> argv;  // argv[0]: the krab executable, an absolute path
  std::vector<std::string> env;   // "NAME=value", the job secret among them: never on argv
};

// A started worker as its provider knows it.
struct WorkerHandle {
  MemberId member;
  std::string id;  // the provider's name for it: a pid ("1234"), a Slurm job id ("17")
};

class Provider {
 public:
  virtual ~Provider() = default;

  virtual const char* name() const = 0;  // "local", "slurm": the value of the config key
  // Starts one worker. Throws Error when it cannot (the message names the command).
  virtual WorkerHandle add(const WorkerSpec& spec) = 0;
  // Asks the worker to leave gracefully (SIGTERM). Best effort.
  virtual void remove(const WorkerHandle& handle) = 0;
  // Stops the worker now (SIGKILL, or cancels its job). Best effort.
  virtual void kill(const WorkerHandle& handle) = 0;
  // Workers that could start now beyond the running ones; a large number when the provider
  // sets no bound of its own (the policy's elastic.max_workers still applies).
  virtual int capacity() = 0;
  // Additions given up since the last call: they will never join.
  virtual std::vector<WorkerHandle> poll() { return {}; }
  // The end of the run: stop whatever is left of what add() started, and wait (bounded) until
  // it is gone. Best effort.
  virtual void shutdown() {}
};

}  // namespace krab::elastic
