#include "cli/resources.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/errors.h"

namespace krab::cli {
namespace {

// Measured, not guessed: the peak RSS (VmHWM in /proc/PID/status) of one worker of a job with
// nearly no data and model (mlp hidden 32 on 2048 synthetic samples of 32 features) was
// 172 MiB on Debian 12's LibTorch 1.13; a worker training the CNN on Fashion-MNIST peaked at
// 420 MiB, of which the estimate below accounts 2 x 220 MB of data; a gpt worker's process is
// about 180 MiB. memory_model.h keeps the two numbers (192 MiB, 2 copies), which the report
// uses too.
constexpr int64_t kFixedWorkerBytes = parallel::zero::kWorkerProcessBytes;
constexpr int64_t kDataCopies = parallel::zero::kDataCopies;
constexpr int64_t kParameterCopies = 5;

std::string gib(int64_t bytes) {
  char buf[32];
  const double g = static_cast<double>(bytes) / (int64_t{1} << 30);
  std::snprintf(buf, sizeof(buf), g >= 10 ? "%.0f GiB" : "%.1f GiB", g);
  return buf;
}

std::string mib(int64_t bytes) { return str_cat((bytes + (int64_t{1} << 19)) >> 20, " MiB"); }

// GiB from 1 GiB up, MiB below, so that small kinds do not read "0.0 GiB".
std::string size_text(int64_t bytes) {
  return bytes >= (int64_t{1} << 30) ? gib(bytes) : mib(bytes);
}

// v1 reports "unlimited" as the largest page-aligned int64; anything this large is no limit.
constexpr int64_t kNoLimit = int64_t{1} << 60;

// A limit file's value: -1 for "max", no limit, or a file that cannot be read.
int64_t read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    const int64_t v = std::stoll(text);
    return v > 0 && v < kNoLimit ? v : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// The cgroup path of the memory controller in a /proc/PID/cgroup file, and whether it is v1.
// Empty when the file has neither a v1 memory line nor a v2 line.
std::pair<std::string, bool> memory_cgroup(const std::string& self_cgroup) {
  std::ifstream in(self_cgroup);
  std::string line, v2;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const std::string path = line.substr(b + 1);
    if (controllers.find(",memory,") != std::string::npos) return {path, true};
    if (line.compare(0, a, "0") == 0 && b == a + 1) v2 = path;
  }
  return {v2, false};
}

}  // namespace

WorkerFootprint estimate_worker_memory(int64_t data_bytes, int64_t parameters) {
  WorkerFootprint f;
  f.fixed_bytes = kFixedWorkerBytes;
  f.data_bytes = kDataCopies * data_bytes;
  f.model_bytes = kParameterCopies * 4 * parameters;
  return f;
}

WorkerFootprint estimate_worker_memory(int64_t data_bytes,
                                       const parallel::zero::MemoryPrediction& model) {
  WorkerFootprint f = estimate_worker_memory(data_bytes, 0);
  f.model = model;
  f.model_bytes = model.resident();
  return f;
}

namespace {

// The "NAME: N kB" line of /proc/meminfo or /proc/PID/status in bytes, -1 when absent.
int64_t kib_field(const std::string& file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  const std::string key = name + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

int64_t mem_available(const std::string& meminfo) { return kib_field(meminfo, "MemAvailable"); }

}  // namespace

int64_t available_memory_bytes() { return mem_available("/proc/meminfo"); }

int64_t cgroup_memory_limit(const MemorySources& sources, std::string* file) {
  auto [path, v1] = memory_cgroup(sources.self_cgroup);
  if (path.empty()) return -1;
  const std::string base = v1 ? sources.cgroup_root + "/memory" : sources.cgroup_root;
  const char* name = v1 ? "memory.limit_in_bytes" : "memory.max";
  int64_t best = -1;
  // The cgroup itself, then each ancestor up to the root of the hierarchy.
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string candidate = base + (path == "/" ? "" : path) + "/" + name;
    const int64_t limit = read_limit(candidate);
    if (limit > 0 && (best < 0 || limit < best)) {
      best = limit;
      if (file != nullptr) *file = candidate;
    }
    if (path.empty() || path == "/") break;
    path = path.substr(0, path.rfind('/'));
    if (path.empty()) path = "/";
  }
  return best;
}

namespace {

// The cgroup's room for the workers: its limit less the launcher, never below 0.
int64_t cgroup_room(const MemoryBudget& b) {
  return b.cgroup_limit < 0 ? -1 : std::max<int64_t>(0, b.cgroup_limit - b.launcher_bytes);
}

}  // namespace

int64_t MemoryBudget::bytes() const {
  const int64_t room = cgroup_room(*this);
  if (mem_available < 0) return room;
  if (room < 0) return mem_available;
  return std::min(mem_available, room);
}

std::string MemoryBudget::source() const {
  const int64_t room = cgroup_room(*this);
  if (room >= 0 && (mem_available < 0 || room < mem_available))
    return str_cat("the cgroup limit in ", cgroup_file, ", ", size_text(cgroup_limit), " less ",
                   size_text(launcher_bytes), " for the launcher itself, leaves");
  return "MemAvailable in /proc/meminfo";
}

MemoryBudget read_memory_budget(const MemorySources& sources) {
  MemoryBudget b;
  b.mem_available = mem_available(sources.meminfo);
  b.cgroup_limit = cgroup_memory_limit(sources, &b.cgroup_file);
  b.launcher_bytes = std::max<int64_t>(0, kib_field(sources.self_status, "VmRSS"));
  return b;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

namespace {

void check_processes(int processes, const WorkerFootprint& footprint, int64_t available,
                     const std::string& source, const std::string& key) {
  const double need = static_cast<double>(processes) * static_cast<double>(footprint.total());
  KRAB_CHECK_ARG(need <= static_cast<double>(available), key, ": ", processes,
                 " worker processes on this node need about ", gib(static_cast<int64_t>(need)),
                 " (", mib(footprint.total()), " each: ", mib(footprint.fixed_bytes),
                 " LibTorch process, ", mib(footprint.data_bytes), " data, ",
                 mib(footprint.model_bytes), " model and optimizer) but this machine has ",
                 gib(available), " available (", source, "); use fewer workers");
}

// The prediction for `job` with the stage and checkpointing replaced.
WorkerFootprint footprint_at(const JobMemory& job, int stage, bool checkpointing) {
  parallel::zero::MemoryInputs in = job.inputs;
  in.stage = stage;
  in.activation_checkpointing = checkpointing;
  in.activation_bytes = checkpointing && job.activations_checkpointed >= 0
                            ? job.activations_checkpointed
                            : job.activations_plain;
  return estimate_worker_memory(job.data_bytes, parallel::zero::predict_memory(in));
}

std::string setting(int stage, bool checkpointing, const JobMemory& job) {
  std::string s;
  if (stage != job.inputs.stage) s = str_cat("parallel.zero_stage: ", stage);
  if (checkpointing && !job.inputs.activation_checkpointing)
    s += str_cat(s.empty() ? "" : " and ", "model.activation_checkpointing: true");
  return s;
}

// What would fit, evaluated: a higher stage alone first (no recomputation), then
// checkpointing alone, then both; the first that fits. `per_worker` is the budget of one.
std::string advice(const JobMemory& job, int64_t per_worker) {
  const int s0 = job.inputs.stage;
  const bool c0 = job.inputs.activation_checkpointing;
  const bool can_checkpoint = job.activations_checkpointed >= 0;
  std::vector<std::pair<int, bool>> tries;
  for (int s = s0 + 1; s <= 3; ++s) tries.push_back({s, c0});
  if (can_checkpoint && !c0) {
    tries.push_back({s0, true});
    for (int s = s0 + 1; s <= 3; ++s) tries.push_back({s, true});
  }
  for (const auto& [s, c] : tries) {
    const int64_t need = footprint_at(job, s, c).total();
    if (need <= per_worker)
      return str_cat("it would fit with ", setting(s, c, job), " (about ", size_text(need),
                     " per worker)");
  }
  const bool c = c0 || can_checkpoint;
  const std::string cheapest = setting(3, c, job);
  return str_cat("it does not fit even at ", cheapest.empty() ? "the cheapest setting" : cheapest,
                 " (about ", size_text(footprint_at(job, 3, c).total()),
                 " per worker); use more nodes or a smaller model");
}

std::string by_kind(const WorkerFootprint& f, bool activations_predicted) {
  const parallel::zero::MemoryPrediction& m = f.model;
  std::string s =
      str_cat(size_text(m.params), " params, ", size_text(m.grads), " grads, ",
              size_text(m.optimizer), " optimizer, ", size_text(m.working_set), " working set, ");
  if (m.comm_buffers > 0) s += str_cat(size_text(m.comm_buffers), " comm buffers, ");
  if (m.low_precision > 0) s += str_cat(size_text(m.low_precision), " bf16 copies, ");
  if (m.compression > 0) s += str_cat(size_text(m.compression), " compression residuals, ");
  s += activations_predicted ? str_cat(size_text(m.activations), " activations, ")
                             : std::string("activations not predicted, ");
  if (m.evaluation > 0) s += str_cat(size_text(m.evaluation), " evaluation, ");
  if (m.heap > 0) s += str_cat(size_text(m.heap), " heap slack, ");
  return s + str_cat(size_text(f.fixed_bytes), " process, ", size_text(f.data_bytes), " data");
}

}  // namespace

void check_memory(int processes, const WorkerFootprint& footprint, int64_t available,
                  const std::string& key) {
  if (available < 0) return;
  check_processes(processes, footprint, available, "MemAvailable in /proc/meminfo", key);
}

void check_job_memory(int processes, const JobMemory& job, const MemoryBudget& budget,
                      const std::string& key) {
  const int64_t available = budget.bytes();
  if (available < 0) return;
  const WorkerFootprint f =
      footprint_at(job, job.inputs.stage, job.inputs.activation_checkpointing);
  if (static_cast<double>(processes) * static_cast<double>(f.total()) <=
      static_cast<double>(available))
    return;
  // Too many processes for the node whatever the model: the number of workers is at fault.
  if (static_cast<double>(processes) *
          static_cast<double>(estimate_worker_memory(job.data_bytes, 0).total()) >
      static_cast<double>(available))
    check_processes(processes, f, available, budget.source(), key);
  const int64_t per_worker = available / processes;
  throw InvalidArgument(str_cat("parallel.zero_stage ", job.inputs.stage, ": ", job.model,
                                " needs about ", size_text(f.total()), " per worker (", key, " ",
                                processes, ": ", by_kind(f, job.activations_predicted),
                                ") but each has ", size_text(per_worker), " (", budget.source(),
                                " ", size_text(available), " / ", processes, "); ",
                                advice(job, per_worker)));
}

void warn_if_oversubscribed(int processes, int cores, const std::string& key) {
  if (processes <= cores) return;
  std::fprintf(stderr,
               "krab: warning: %s: %d worker processes on %d cores will share them; every step "
               "waits for the slowest, so fewer workers may train faster\n",
               key.c_str(), processes, cores);
}

}  // namespace krab::cli
