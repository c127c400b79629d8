#include "elastic/providers/local.h"

#include <signal.h>

#include <limits>
#include <string>

namespace krab::elastic {

namespace {

// The handle's pid; 0 for one that is not a pid (never signalled: kill(0) is the group).
pid_t pid_of(const WorkerHandle& handle) {
  try {
    const long pid = std::stol(handle.id);
    return pid > 0 ? static_cast<pid_t>(pid) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

LocalProvider::LocalProvider(std::function<pid_t(const WorkerSpec&)> spawn)
    : spawn_(std::move(spawn)) {}

WorkerHandle LocalProvider::add(const WorkerSpec& spec) {
  return {spec.member, std::to_string(spawn_(spec))};
}

void LocalProvider::remove(const WorkerHandle& handle) {
  if (const pid_t pid = pid_of(handle)) ::kill(pid, SIGTERM);
}

void LocalProvider::kill(const WorkerHandle& handle) {
  if (const pid_t pid = pid_of(handle)) ::kill(pid, SIGKILL);
}

int LocalProvider::capacity() { return std::numeric_limits<int>::max(); }

}  // namespace krab::elastic
