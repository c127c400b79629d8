#include "core/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/errors.h"

extern char** environ;

namespace krab::core {

std::vector<std::string> program_environment() {
  std::vector<std::string> env{"PATH=/usr/bin:/bin"};
  // The locale decides how the program reads and prints text; nothing else of krab's
  // environment is its business.
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    if (var.rfind("LANG=", 0) == 0 || var.rfind("LANGUAGE=", 0) == 0 || var.rfind("LC_", 0) == 0)
      env.push_back(var);
  }
  return env;
}

namespace {

// Writes `input` to `fd` and closes it. On a thread of its own while the caller drains the
// output, so that neither pipe can fill up and stall the other.
void feed(int fd, const std::string& input) {
  size_t at = 0;
  while (at < input.size()) {
    const ssize_t n = ::write(fd, input.data() + at, input.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the program exited early: its status says why
    at += static_cast<size_t>(n);
  }
  ::close(fd);
}

pid_t spawn(const std::string& program, const std::vector<std::string>& args, int in, int out) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in, 0);
  posix_spawn_file_actions_adddup2(&actions, out, 1);
  posix_spawn_file_actions_adddup2(&actions, out, 2);
  // O_CLOEXEC covers the pipes; this covers whatever a library opened without it.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  std::vector<std::string> argv_text{program};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  const std::vector<std::string> env_text = program_environment();
  std::vector<char*> argv, envp;
  for (const auto& a : argv_text) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  pid_t pid = -1;
  // posix_spawn, not posix_spawnp: the path is taken as it is, never searched for on PATH.
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw InvalidArgument(str_cat("cannot run ", program, ": ", std::strerror(rc)));
  return pid;
}

}  // namespace

ProgramResult run_program(const std::string& program, const std::vector<std::string>& args,
                          const std::string& input) {
  KRAB_CHECK_ARG(!program.empty() && program[0] == '/', "run_program: '", program,
                 "' is not an absolute path");
  int in[2], out[2];
  KRAB_CHECK(::pipe2(in, O_CLOEXEC) == 0, "pipe2: ", std::strerror(errno));
  if (::pipe2(out, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(in[0]);
    ::close(in[1]);
    KRAB_CHECK(false, "pipe2: ", std::strerror(err));
  }
  pid_t pid = -1;
  try {
    pid = spawn(program, args, in[0], out[1]);
  } catch (...) {
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    throw;
  }
  ::close(in[0]);
  ::close(out[1]);
  std::thread writer(feed, in[1], std::cref(input));
  ProgramResult result;
  char buf[1 << 16];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    result.out.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  writer.join();
  int ws = 0;
  while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  return result;
}

}  // namespace krab::core
