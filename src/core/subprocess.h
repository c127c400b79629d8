// Running a program krab does not link (Debian's spm_encode, say) without handing it more of
// krab than its input.
//
// A worker's process holds the job's secret in its environment (KRAB_JOB_SECRET), sockets to its
// peers and files it has open. A program it runs gets none of that:
//   - it is named by absolute path, never looked up on PATH, where an earlier directory could
//     hold a program of the same name;
//   - it gets stdin, stdout and stderr and no other descriptor: every other one of krab's is
//     closed in the child, and the pipes are close-on-exec in krab, so a program another thread
//     starts at the same moment does not inherit them either;
//   - its environment is PATH=/usr/bin:/bin and krab's locale variables (LANG, LANGUAGE, LC_*),
//     nothing else.
// Thread-safe: each call has its own pipes and child.
#pragma once

#include <string>
#include <vector>

namespace krab::core {

struct ProgramResult {
  int status = -1;  // exit status, or -1 when the program did not exit normally
  std::string out;  // stdout and stderr together
};

// Runs `program` (an absolute path) with `args` (argv[1..]; argv[0] is `program`), feeds it
// `input` on stdin and returns what it printed once it has exited. Throws InvalidArgument when
// `program` is not an absolute path or cannot be started (message names it and the reason);
// a program that starts and fails is a non-zero `status`, not an exception.
ProgramResult run_program(const std::string& program, const std::vector<std::string>& args,
                          const std::string& input);

// The environment run_program gives a program ("NAME=value" strings), from this process's.
std::vector<std::string> program_environment();

}  // namespace krab::core
