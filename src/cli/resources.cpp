#include "cli/resources.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace krab::cli {
namespace {

// Measured, not guessed: the peak RSS (VmHWM in /proc/PID/status) of one worker of a job with
// nearly no data and model (mlp hidden 32 on 2048 synthetic samples of 32 features) was
// 172 MiB on Debian 12's LibTorch 1.13; a worker training the CNN on Fashion-MNIST peaked at
// 420 MiB, of which the estimate below accounts 2 x 220 MB of data. 160 MiB plus the data and
// model terms covers both.
constexpr int64_t kFixedWorkerBytes = int64_t{160} << 20;
constexpr int64_t kDataCopies = 2;
constexpr int64_t kParameterCopies = 5;

std::string gib(int64_t bytes) {
  char buf[32];
  const double g = static_cast<double>(bytes) / (int64_t{1} << 30);
  std::snprintf(buf, sizeof(buf), g >= 10 ? "%.0f GiB" : "%.1f GiB", g);
  return buf;
}

std::string mib(int64_t bytes) { return str_cat((bytes + (int64_t{1} << 19)) >> 20, " MiB"); }

}  // namespace

WorkerFootprint estimate_worker_memory(int64_t data_bytes, int64_t parameters) {
  WorkerFootprint f;
  f.fixed_bytes = kFixedWorkerBytes;
  f.data_bytes = kDataCopies * data_bytes;
  f.model_bytes = kParameterCopies * 4 * parameters;
  return f;
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void check_memory(int processes, const WorkerFootprint& footprint, int64_t available,
                  const std::string& key) {
  if (available < 0) return;
  const double need = static_cast<double>(processes) * static_cast<double>(footprint.total());
  KRAB_CHECK_ARG(need <= static_cast<double>(available), key, ": ", processes,
                 " worker processes on this node need about ", gib(static_cast<int64_t>(need)),
                 " (", mib(footprint.total()), " each: ", mib(footprint.fixed_bytes),
                 " LibTorch process, ", mib(footprint.data_bytes), " data, ",
                 mib(footprint.model_bytes), " model and optimizer) but this machine has ",
                 gib(available), " available (MemAvailable in /proc/meminfo); use fewer workers");
}

void warn_if_oversubscribed(int processes, int cores, const std::string& key) {
  if (processes <= cores) return;
  std::fprintf(stderr,
               "krab: warning: %s: %d worker processes on %d cores will share them; every step "
               "waits for the slowest, so fewer workers may train faster\n",
               key.c_str(), processes, cores);
}

}  // namespace krab::cli
