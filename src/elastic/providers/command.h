// Running a cluster client (sbatch, scancel, sinfo, squeue) from the launcher: a bounded call
// whose output is read back, and the error a failed call becomes.
//
// Unlike core/subprocess.h (a tool that must see none of krab), these programs are given an
// environment on purpose — the Slurm client reads SLURM_CONF from it, and `sbatch --export=ALL`
// hands it to the job —, and they can hang on a controller that does not answer, so every call
// has a deadline after which the program is killed.
//
// Thread-safe: each call has its own pipes and child.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace krab::elastic {

struct CommandResult {
  int status = -1;         // exit status; -1 when killed (by a signal, or at the deadline)
  bool timed_out = false;  // killed at the deadline
  std::string out;         // stdout
  std::string err;         // stderr
};

// Runs argv[0] (an absolute path, not searched for) with argv[1..] and exactly `env`
// ("NAME=value"), stdin from /dev/null, no other descriptor of this process. Waits up to
// `timeout`, then SIGKILLs it and returns timed_out. Throws Error when it cannot be started
// (the message names the program and the reason).
CommandResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          std::chrono::milliseconds timeout);

// The absolute path of `program` in the ':'-separated directories of `path` (an executable
// regular file), or "" when none has it.
std::string find_in_path(const std::string& program, const std::string& path);

// The first non-empty line of `text`, trimmed of trailing whitespace; "" if none.
std::string first_line(const std::string& text);

// What a failed call says: "`sbatch --parsable ...` exited with status 1: <its stderr's first
// line>" (or "was killed after 30 s", or "...: (no output)"). `shown` is the command as the
// message shows it (argv without the environment; a long --wrap may be abbreviated by the
// caller).
std::string describe_failure(const std::string& shown, const CommandResult& result,
                             std::chrono::milliseconds timeout);

}  // namespace krab::elastic
