// The `local` provider (elastic.autoscale.provider: local): an added worker is another process
// of this launcher on this machine, in a new slot. The launcher keeps the spawning (fork, its
// children table, waitpid): it hands the provider the function that does it, and the provider
// adds nothing but the policy's verbs. Its capacity is unbounded — elastic.max_workers is the
// bound, and it is the policy, not a core count, that must find extra workers do not pay
// (docs/design/elastic.md §8).
#pragma once

#include <sys/types.h>

#include <functional>

#include "elastic/providers/provider.h"

namespace krab::elastic {

class LocalProvider : public Provider {
 public:
  // `spawn` starts the worker as the launcher's child and returns its pid (it throws on
  // failure).
  explicit LocalProvider(std::function<pid_t(const WorkerSpec&)> spawn);

  const char* name() const override { return "local"; }
  WorkerHandle add(const WorkerSpec& spec) override;  // handle id: the pid
  void remove(const WorkerHandle& handle) override;   // SIGTERM
  void kill(const WorkerHandle& handle) override;     // SIGKILL
  int capacity() override;                            // no bound of its own

 private:
  std::function<pid_t(const WorkerSpec&)> spawn_;
};

}  // namespace krab::elastic
