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
// Activations are left out: they scale with data.batch_size and are small next to the rest
// for the models krab ships. The estimate is compared with MemAvailable from /proc/meminfo,
// the kernel's own figure for memory that can be handed out without swapping.
#pragma once

#include <cstdint>
#include <string>

namespace krab::cli {

struct WorkerFootprint {
  int64_t fixed_bytes = 0;
  int64_t data_bytes = 0;
  int64_t model_bytes = 0;
  int64_t total() const { return fixed_bytes + data_bytes + model_bytes; }
};

// The estimate above for a worker whose data tensors take `data_bytes` and whose model has
// `parameters` parameters. Pure.
WorkerFootprint estimate_worker_memory(int64_t data_bytes, int64_t parameters);

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
