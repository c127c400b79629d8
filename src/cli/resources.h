// Does this node have room for the processes a job asks for? Checked by the launcher before it
// spawns anything, so `parallel.workers: 500` on a small machine is one line and exit 2 instead
// of hundreds of processes and the OOM killer.
//
// The memory a worker needs is an estimate, deliberately simple and on the generous side:
//   fixed     LibTorch process overhead (libraries, allocator arenas, the thread pool), measured;
//   data      every worker loads the whole data set (train and test tensors), and holds about
//             twice that while loading (the raw file and its float copy);
//   model     parameters, gradients, up to two optimizer moments and the bucket buffers of
//             DataParallel: five float copies of the parameters.
// Activations are left out of that rough form. The launcher uses the finer one instead: the
// model term is parallel::zero::predict_memory's prediction for the job's ZeRO stage, optimizer
// and options, with activations estimated from the model's shapes (train/memory_plan.h), and
// the budget is the smaller of MemAvailable from /proc/meminfo (the kernel's own figure for
// memory that can be handed out without swapping) and the memory limit of the cgroup the
// launcher runs in, which the workers inherit and share.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/zero/memory_model.h"

namespace krab::cli {

struct WorkerFootprint {
  int64_t fixed_bytes = 0;
  int64_t data_bytes = 0;
  int64_t model_bytes = 0;
  // The model term by kind, when it comes from a prediction (model_bytes = its resident()).
  parallel::zero::MemoryPrediction model;
  int64_t total() const { return fixed_bytes + data_bytes + model_bytes; }
};

// The estimate above for a worker whose data tensors take `data_bytes` and whose model has
// `parameters` parameters (five float copies). Pure.
WorkerFootprint estimate_worker_memory(int64_t data_bytes, int64_t parameters);

// The same with the model term `model` (a predict_memory result; its resident() bytes). Pure.
WorkerFootprint estimate_worker_memory(int64_t data_bytes,
                                       const parallel::zero::MemoryPrediction& model);

// Where the budget is read; the defaults are the live system's files, tests point them at a
// fake tree.
struct MemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";  // "ID:CONTROLLERS:PATH" lines
  std::string cgroup_root = "/sys/fs/cgroup";     // v1: ROOT/memory/PATH; v2: ROOT/PATH
  std::string self_status = "/proc/self/status";  // VmRSS: the launcher's own resident bytes
};

// The memory the workers of this launcher may use together. The launcher stays resident while
// they run, in the same cgroup (one node = one cgroup: the workers inherit the launcher's), so
// its own resident bytes come off the cgroup limit; MemAvailable already leaves them out.
struct MemoryBudget {
  int64_t mem_available = -1;  // MemAvailable in bytes; -1 when unreadable
  int64_t cgroup_limit = -1;   // the cgroup's limit in bytes; -1 when none or unreadable
  std::string cgroup_file;     // the file the limit came from
  int64_t launcher_bytes = 0;  // the launcher's resident bytes (VmRSS), 0 when unreadable
  // The smaller of MemAvailable and the cgroup limit less launcher_bytes, of those known; -1
  // when neither is known (then nothing is refused).
  int64_t bytes() const;
  // Which value bytes() is and where it comes from: "MemAvailable in /proc/meminfo" or
  // "the cgroup limit in FILE, 3.0 GiB less 290 MiB for the launcher itself, leaves".
  std::string source() const;
};

// The cgroup memory limit of the process whose /proc/PID/cgroup is `sources.self_cgroup`: under
// cgroup v1 the `memory` controller's path and memory.limit_in_bytes, under v2 (the "0::" line,
// when no v1 memory line exists) memory.max. The smallest limit over the cgroup and its
// ancestors that exist under cgroup_root (a limit on a parent caps the child too; inside a
// container the path may not exist and the root is the container's own cgroup). "max" and v1's
// "unlimited" (2^63 rounded to a page) are no limit. Returns -1 for no limit and sets *file to
// the file of the limit found.
int64_t cgroup_memory_limit(const MemorySources& sources, std::string* file);

// MemAvailable, the cgroup limit and this process's VmRSS from `sources`. Call it when the
// launcher holds what it will hold while the workers run (after it has loaded the data: more,
// which is the safe side).
MemoryBudget read_memory_budget(const MemorySources& sources = {});

// A job's memory, predicted from its configuration alone (train/memory_plan.h fills it).
struct JobMemory {
  std::string model;                      // "a gpt of 38.7 B parameters"
  parallel::zero::MemoryInputs inputs;    // as configured; activation_bytes for its checkpointing
  int64_t activations_plain = 0;          // activation estimate without checkpointing
  int64_t activations_checkpointed = -1;  // with model.activation_checkpointing; -1: no estimate
  bool activations_predicted = true;      // false: activations are not in the numbers
  int64_t data_bytes = 0;                 // data tensors one worker holds
};

// Refuses (InvalidArgument, exit 2) `processes` workers of `job` when together they need more
// than `budget.bytes()`. When even a worker with no model would not fit it is check_memory's
// message ("use fewer workers"); otherwise one line naming the stage, the model, the bytes per
// worker by kind against the budget per worker and where the budget comes from, and what
// would fit: the cheapest of a higher parallel.zero_stage and model.activation_checkpointing:
// true that fits, found by evaluating each with predict_memory, or that it does not fit even at
// stage 3 with checkpointing (and how much that would need). `budget.bytes()` < 0 skips the
// check. Pure apart from the exception.
void check_job_memory(int processes, const JobMemory& job, const MemoryBudget& budget,
                      const std::string& key);

// MemAvailable from /proc/meminfo in bytes, or -1 when it cannot be read (then nothing is
// refused).
int64_t available_memory_bytes();

// CPUs this process may run on (sched_getaffinity), at least 1.
int usable_cores();

// Refuses (InvalidArgument, exit 2) `processes` processes of `footprint` each when together
// they need more than `available` bytes; the message names `key` (the setting that asked for
// them, e.g. "parallel.workers" or "--nproc-per-node"), both numbers and what a worker's
// estimate is made of. `available` < 0 skips the check. Pure apart from the exception.
void check_memory(int processes, const WorkerFootprint& footprint, int64_t available,
                  const std::string& key);

// One stderr line when `processes` exceeds `cores`: they will share the cores, each step
// waits for the slowest, and the run is slower than with fewer workers.
void warn_if_oversubscribed(int processes, int cores, const std::string& key);

}  // namespace krab::cli
