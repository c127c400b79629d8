#include "elastic/support/etcd_daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace krab::test {

namespace {

using Clock = std::chrono::steady_clock;

// The value of NAME=VALUE in `text`, or "" when that line is absent.
std::string value_of(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind(name + "=", 0) == 0) return line.substr(name.size() + 1);
  return "";
}

// A member killed by us stays a zombie until the script reaps it: gone means no process or
// state Z in /proc/<pid>/stat.
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(stat, all)) return false;
  const size_t paren = all.rfind(')');
  return paren == std::string::npos || paren + 2 >= all.size() || all[paren + 2] != 'Z';
}

}  // namespace

std::unique_ptr<EtcdDaemon> EtcdDaemon::start(int members, std::string* skip_reason) {
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("EtcdDaemon: pipe failed");
  const std::string script = std::string(KRAB_SOURCE_DIR) + "/tests/elastic/support/start_etcd.sh";
  const std::string count = std::to_string(members);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("EtcdDaemon: fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execl("/bin/bash", "bash", script.c_str(), "-n", count.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::unique_ptr<EtcdDaemon> daemon(new EtcdDaemon());
  daemon->script_ = pid;

  // Read until the three lines are there, the script exits, or 60 s pass (three start tries of
  // a 3-member cluster, each bounded by 20 s in the script).
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (value_of(text, "KRAB_TEST_ETCD_DIR").empty() && Clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[512];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;  // the script ended
    text.append(buf, size_t(n));
  }
  close(out[0]);
  if (value_of(text, "KRAB_TEST_ETCD_DIR").empty()) {
    int status = 0;
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    daemon->script_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      *skip_reason = text.empty() ? "no etcd" : text;
      return nullptr;
    }
    throw std::runtime_error("EtcdDaemon: start_etcd.sh did not start etcd: " + text);
  }
  daemon->endpoints_ = value_of(text, "KRAB_TEST_ETCD_ENDPOINTS");
  std::istringstream eps(daemon->endpoints_);
  for (std::string ep; std::getline(eps, ep, ',');) daemon->list_.push_back(ep);
  std::istringstream pids(value_of(text, "KRAB_TEST_ETCD_PIDS"));
  for (pid_t p; pids >> p;) daemon->members_.push_back(p);
  return daemon;
}

EtcdDaemon::~EtcdDaemon() {
  if (script_ <= 0) return;
  kill(script_, SIGTERM);
  // The script stops its members within ~1 s and exits; SIGKILL after 10 s (its watchdog then
  // kills the members).
  for (int i = 0; i < 100; ++i) {
    if (waitpid(script_, nullptr, WNOHANG) == script_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(script_, SIGKILL);
  waitpid(script_, nullptr, 0);
}

void EtcdDaemon::kill_member(size_t i) {
  const pid_t pid = members_.at(i);
  kill(pid, SIGKILL);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (running(pid) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (running(pid))
    throw std::runtime_error("EtcdDaemon: member " + std::to_string(i) + " survived SIGKILL");
}

int closed_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("closed_port: cannot bind a loopback socket");
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace krab::test
