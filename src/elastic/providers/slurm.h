// The `slurm` provider (elastic.autoscale.provider: slurm, docs/design/elastic.md §8, §15.7):
// an added worker is a one-task Slurm batch job that runs the worker's command line itself.
//
//   add     sbatch --parsable --job-name=krab-<job> --ntasks=1 --export=ALL
//                  --output=RUN_DIR/slurm-%j.out --wrap "exec <the worker's argv>"
//           run with the worker's environment as sbatch's own, which --export=ALL hands to the
//           job: KRAB_MEMBER_ID, KRAB_ELASTIC_JOIN, the store and the job secret travel there,
//           never on a command line. `exec` makes the worker the batch step's process, so that
//           the removal's signal reaches it (a /bin/sh wrapper would die of it instead).
//   remove  scancel --batch --signal=TERM <id>: the worker's graceful leave. (A plain
//           `scancel --signal=TERM` signals job steps only, and a --wrap job has none.)
//   kill    scancel --full --signal=KILL <id>: a member the keeper dropped.
//   capacity  idle CPUs: the 2nd field of `sinfo -h -o %C` (allocated/idle/other/total),
//           summed over its lines; 0 while sinfo fails. Read at most once per `refresh`.
//   poll    `squeue -h --states=all -j <ids> -o "%i %T"`, at most once per `refresh`: a job
//           still PENDING elastic.wait_s after its submission is cancelled and given up (no
//           capacity after all); a job that is no longer pending or running (or no longer
//           listed) is gone — the launcher decides whether that was before it joined.
//   shutdown  every job not yet gone: a pending one is cancelled; a running one gets
//           `end_grace` to end with the run by itself, then SIGTERM (its graceful leave), then
//           after another `end_grace` a SIGKILL of everything in it; returns once squeue lists
//           none of them as active or completing (bounded: 2 × end_grace + 2 × timeout).
//
// Where the worker runs decides how it reaches the run: the job's store is a file in the
// launcher's private directory (KRAB_STORE_FILE), so the node running the job must see that
// file — the machine of the launcher (a single-node cluster, the test) or a shared filesystem
// with TMPDIR on it. The job starts in the launcher's working directory (sbatch's default), so
// the job's relative paths mean the same.
//
// A Slurm worker is not the launcher's child: the keeper sees its death by heartbeats
// (elastic.dead_after_ms), and its output goes to RUN_DIR/slurm-<id>.out.
//
// Every client call is bounded by `timeout` and killed past it; a failure names the command
// and the first line of its stderr.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "elastic/providers/command.h"
#include "elastic/providers/provider.h"

namespace krab::elastic {

// Absolute paths of the Slurm clients the provider runs.
struct SlurmClients {
  std::string sbatch, scancel, sinfo, squeue;
};

// Finds sbatch, scancel, sinfo and squeue in the ':'-separated `path`. Throws InvalidArgument
// naming elastic.autoscale.provider and the first one missing: "... sbatch is not in PATH:
// slurm-wlm's client is not installed; or provider: local".
SlurmClients find_slurm_clients(const std::string& path);

// Runs `sinfo -h -o %C` once with `env`; returns the idle CPUs. Throws InvalidArgument naming
// elastic.autoscale.provider when it fails or says something else: "... the Slurm controller
// does not answer: <sinfo's line>".
int check_slurm_controller(const SlurmClients& clients, const std::vector<std::string>& env,
                           std::chrono::milliseconds timeout);

struct SlurmOptions {
  SlurmClients clients;
  std::string job_name;            // --job-name (krab-<the job's name>)
  std::string run_dir;             // absolute: --output=RUN_DIR/slurm-%j.out
  std::vector<std::string> env;    // the clients' environment (SLURM_CONF, PATH, ...)
  std::vector<std::string> extra;  // more sbatch arguments (a partition, a time limit)
  std::chrono::milliseconds pending_limit{60000};  // elastic.wait_s
  std::chrono::milliseconds timeout{30000};        // each client call
  std::chrono::milliseconds refresh{1000};         // capacity and job states at most this often
  std::chrono::milliseconds end_grace{5000};       // shutdown: see above
};

// Pure parts, tested on their own.
// `exec` and each argument single-quoted for /bin/sh: the --wrap text.
std::string slurm_wrap(const std::vector<std::string>& argv);
// sbatch --parsable's answer "<id>" or "<id>;<cluster>": the id, or nullopt.
std::optional<std::string> parse_sbatch_id(const std::string& out);
// The idle CPUs of `sinfo -h -o %C` ("A/I/O/T" per line), summed; nullopt when a line is not
// four '/'-separated counts or there is none.
std::optional<int> parse_idle_cpus(const std::string& out);
// `squeue -o "%i %T"` lines: job id -> state.
std::map<std::string, std::string> parse_squeue(const std::string& out);

class SlurmProvider : public Provider {
 public:
  explicit SlurmProvider(SlurmOptions options);
  ~SlurmProvider() override;  // shutdown()

  const char* name() const override { return "slurm"; }
  WorkerHandle add(const WorkerSpec& spec) override;  // handle id: the job id
  void remove(const WorkerHandle& handle) override;
  void kill(const WorkerHandle& handle) override;
  int capacity() override;
  std::vector<WorkerHandle> poll() override;
  void shutdown() override;

  // The jobs submitted and not yet seen gone.
  std::vector<std::string> live_jobs() const;

 private:
  struct Job {
    WorkerHandle handle;
    std::chrono::steady_clock::time_point submitted;
  };
  CommandResult client(const std::vector<std::string>& argv) const;
  void scancel(const std::vector<std::string>& args, const std::vector<std::string>& ids) const;
  // squeue's states of the live jobs; nullopt when squeue failed.
  std::optional<std::map<std::string, std::string>> states() const;

  SlurmOptions options_;
  std::map<std::string, Job> jobs_;  // live jobs by id
  int capacity_ = 0;
  std::chrono::steady_clock::time_point capacity_at_{};  // when capacity_ was read
  std::chrono::steady_clock::time_point polled_at_{};
  std::string capacity_error_;  // sinfo's last failure, said once
};

}  // namespace krab::elastic
