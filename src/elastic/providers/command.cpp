#include "elastic/providers/command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/errors.h"

namespace krab::elastic {

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, int out,
            int err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out, 1);
  posix_spawn_file_actions_adddup2(&actions, err, 2);
  // The launcher holds the store's files and the workers' pipes; a client needs none of them.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cargv.push_back(nullptr);
  cenv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error(str_cat("cannot run ", argv[0], ": ", std::strerror(rc)));
  return pid;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          std::chrono::milliseconds timeout) {
  KRAB_CHECK(!argv.empty() && !argv[0].empty() && argv[0][0] == '/', "run_command: '",
             argv.empty() ? "" : argv[0], "' is not an absolute path");
  int out[2], err[2];
  KRAB_CHECK(::pipe2(out, O_CLOEXEC) == 0, "pipe2: ", std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    KRAB_CHECK(false, "pipe2: ", std::strerror(e));
  }
  pid_t pid = -1;
  try {
    pid = spawn(argv, env, out[1], err[1]);
  } catch (...) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw;
  }
  ::close(out[1]);
  ::close(err[1]);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open = 2;
  char buf[1 << 14];
  // Both pipes are drained together, so that neither can fill up and stall the program.
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      if (got < 0 && errno == EINTR) continue;
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
        continue;
      }
      ::close(fds[i].fd);
      fds[i].fd = -1;  // poll() ignores a negative descriptor
      --open;
    }
  }
  for (const pollfd& p : fds)
    if (p.fd >= 0) ::close(p.fd);
  int ws = 0;
  while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  return result;
}

std::string find_in_path(const std::string& program, const std::string& path) {
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;  // the current directory: never, as with a secure PATH
    const std::string candidate = dir + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return "";
}

std::string first_line(const std::string& text) {
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (!line.empty()) return line;
  }
  return "";
}

std::string describe_failure(const std::string& shown, const CommandResult& result,
                             std::chrono::milliseconds timeout) {
  std::string line = first_line(result.err);
  if (line.empty()) line = first_line(result.out);
  if (line.empty()) line = "(no output)";
  if (result.timed_out)
    return str_cat("`", shown, "` did not finish in ", timeout.count() / 1000.0,
                   " s and was killed", line == "(no output)" ? "" : ": " + line);
  if (result.status < 0) return str_cat("`", shown, "` was killed by a signal: ", line);
  return str_cat("`", shown, "` exited with status ", result.status, ": ", line);
}

}  // namespace krab::elastic
