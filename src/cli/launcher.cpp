#include "cli/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/errors.h"

extern char** environ;

namespace krab::cli {
namespace {

int env_int(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  KRAB_CHECK_ARG(it != env.end(), "environment variable ", key, " is not set");
  char* end = nullptr;
  long v = std::strtol(it->second.c_str(), &end, 10);
  KRAB_CHECK_ARG(end && *end == '\0' && !it->second.empty(), "environment variable ", key,
                 "='", it->second, "' is not an integer");
  return static_cast<int>(v);
}

bool has(const std::map<std::string, std::string>& env, const std::string& key) {
  return env.count(key) > 0 && !env.at(key).empty();
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

}  // namespace

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  return env;
}

LaunchPlan plan_launch(const LaunchFlags& flags, int config_workers,
                       const std::map<std::string, std::string>& env) {
  LaunchPlan p;
  const bool ours = has(env, "KRAB_WORKER");
  const bool torchrun = has(env, "RANK") && has(env, "WORLD_SIZE");
  const bool ompi = has(env, "OMPI_COMM_WORLD_SIZE");
  const bool slurm = has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS");
  if (ours || torchrun || ompi || slurm) {
    p.role = Role::kWorker;
    if (ours || torchrun) {
      p.rank = env_int(env, "RANK");
      p.world_size = env_int(env, "WORLD_SIZE");
      p.local_rank = has(env, "LOCAL_RANK") ? env_int(env, "LOCAL_RANK") : 0;
      p.local_world_size = has(env, "LOCAL_WORLD_SIZE") ? env_int(env, "LOCAL_WORLD_SIZE") : 1;
    } else if (ompi) {
      p.rank = env_int(env, "OMPI_COMM_WORLD_RANK");
      p.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE");
      p.local_rank = has(env, "OMPI_COMM_WORLD_LOCAL_RANK") ? env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") : 0;
      p.local_world_size = has(env, "OMPI_COMM_WORLD_LOCAL_SIZE") ? env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") : 1;
    } else {
      p.rank = env_int(env, "SLURM_PROCID");
      p.world_size = env_int(env, "SLURM_NTASKS");
      p.local_rank = has(env, "SLURM_LOCALID") ? env_int(env, "SLURM_LOCALID") : 0;
      p.local_world_size = has(env, "SLURM_NTASKS_PER_NODE") ? env_int(env, "SLURM_NTASKS_PER_NODE") : 1;
    }
    KRAB_CHECK_ARG(p.world_size >= 1, "world size must be >= 1, got ", p.world_size);
    KRAB_CHECK_ARG(p.rank >= 0 && p.rank < p.world_size, "rank ", p.rank, " is outside 0..",
                   p.world_size - 1);
    const std::string addr = has(env, "MASTER_ADDR") ? env.at("MASTER_ADDR") : "127.0.0.1";
    const std::string port = has(env, "MASTER_PORT") ? env.at("MASTER_PORT") : "29500";
    if (ours && has(env, "KRAB_STORE_FILE"))
      p.rendezvous = comm::Endpoint{"127.0.0.1", 0, env.at("KRAB_STORE_FILE")};
    else
      p.rendezvous = comm::parse_endpoint(addr + ":" + port, "MASTER_ADDR:MASTER_PORT");
    if (has(env, "KRAB_JOB_SECRET")) p.rendezvous.secret = env.at("KRAB_JOB_SECRET");
    p.host_store = !ours && p.rank == 0;
    if (has(env, "KRAB_PS_SHARD")) p.ps_shard = env_int(env, "KRAB_PS_SHARD");
    return p;
  }
  p.role = Role::kLauncher;
  KRAB_CHECK_ARG(flags.nnodes >= 1, "--nnodes must be >= 1, got ", flags.nnodes);
  KRAB_CHECK_ARG(flags.node_rank >= 0 && flags.node_rank < flags.nnodes, "--node-rank ",
                 flags.node_rank, " is outside 0..", flags.nnodes - 1);
  KRAB_CHECK_ARG(flags.nnodes == 1 || !flags.rdzv.empty(),
                 "--rdzv HOST:PORT is required with --nnodes > 1");
  int per_node = flags.nproc_per_node;
  if (per_node == 0) {
    KRAB_CHECK_ARG(config_workers % flags.nnodes == 0, "parallel.workers ", config_workers,
                   " is not divisible by --nnodes ", flags.nnodes);
    per_node = config_workers / flags.nnodes;
  }
  KRAB_CHECK_ARG(per_node >= 1, "--nproc-per-node must be >= 1, got ", per_node);
  p.nproc_per_node = per_node;
  p.local_world_size = per_node;
  p.world_size = per_node * flags.nnodes;
  p.node_rank = flags.node_rank;
  p.rendezvous = flags.rdzv.empty() ? comm::Endpoint{"127.0.0.1", 0}
                                    : comm::parse_endpoint(flags.rdzv, "--rdzv");
  p.host_store = flags.node_rank == 0;
  return p;
}

int spawn_and_supervise(const LaunchPlan& plan, const std::vector<std::string>& argv,
                        double grace_seconds) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const pid_t launcher = ::getpid();
  // The processes this launcher owns: node 0's parameter servers (sync.mode async) first,
  // then the local workers.
  struct Child {
    pid_t pid = -1;
    std::string name;  // "rank 3", "parameter server 0"
    bool server = false;
  };
  std::vector<Child> children;
  const int servers = plan.node_rank == 0 ? plan.servers : 0;
  for (int i = 0; i < servers + plan.nproc_per_node; ++i) {
    // A SIGTERM or Ctrl-C while spawning stops the spawning: the loop below stops the ones
    // already started.
    if (g_signal) break;
    const bool server = i < servers;
    const int local = server ? 0 : i - servers;
    const int rank = plan.node_rank * plan.nproc_per_node + local;
    std::vector<std::string> envs;
    for (auto& [k, v] : current_environment())
      if (k != "RANK" && k != "WORLD_SIZE" && k != "LOCAL_RANK" && k != "LOCAL_WORLD_SIZE" &&
          k != "MASTER_ADDR" && k != "MASTER_PORT" && k != "KRAB_WORKER" && k != "KRAB_PS_SHARD" &&
          k != "KRAB_STORE_FILE" && k != "KRAB_JOB_SECRET")
        envs.push_back(k + "=" + v);
    for (auto& [k, v] : plan.worker_env)
      if (!std::getenv(k.c_str())) envs.push_back(k + "=" + v);
    envs.push_back("KRAB_WORKER=1");
    if (server) envs.push_back("KRAB_PS_SHARD=" + std::to_string(i));
    envs.push_back("RANK=" + std::to_string(rank));
    envs.push_back("LOCAL_RANK=" + std::to_string(local));
    envs.push_back("WORLD_SIZE=" + std::to_string(plan.world_size));
    envs.push_back("LOCAL_WORLD_SIZE=" + std::to_string(plan.nproc_per_node));
    envs.push_back("MASTER_ADDR=" + plan.rendezvous.host);
    if (plan.rendezvous.port > 0)
      envs.push_back("MASTER_PORT=" + std::to_string(plan.rendezvous.port));
    if (!plan.rendezvous.file.empty()) envs.push_back("KRAB_STORE_FILE=" + plan.rendezvous.file);
    // The environment, not the command line: /proc/PID/environ is readable by this user only.
    if (!plan.rendezvous.secret.empty())
      envs.push_back("KRAB_JOB_SECRET=" + plan.rendezvous.secret);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
    const std::string name =
        server ? str_cat("parameter server ", i) : str_cat("rank ", rank);
    pid_t pid = ::fork();
    if (pid < 0) throw Error(str_cat("cannot fork ", name, ": ", std::strerror(errno)));
    if (pid == 0) {
      // Child: die with the launcher, whatever kills it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(1);
      ::execve("/proc/self/exe", cargv.data(), cenv.data());
      ::_exit(127);
    }
    children.push_back({pid, name, server});
  }

  int result = 0;
  int alive = static_cast<int>(children.size());
  if (alive == 0 && g_signal) {
    std::fprintf(stderr, "krab: interrupted before any process was started\n");
    return 130;
  }
  int workers_lost = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::now();
  auto stop_all = [&](int sig) {
    for (const Child& c : children)
      if (c.pid > 0) ::kill(c.pid, sig);
  };
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      Child* child = nullptr;
      for (Child& c : children)
        if (c.pid == pid) child = &c;
      if (!child) continue;
      child->pid = -1;
      --alive;
      int code = 0;
      std::string how;
      if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
        how = str_cat("exited with code ", code);
      } else if (WIFSIGNALED(status)) {
        code = 1;
        how = str_cat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
      }
      if (code != 0 && !stopping && plan.tolerate_worker_loss && !child->server && code != 2 &&
          ++workers_lost < plan.world_size) {
        // Parameter-server training goes on without it (the servers count it out).
        std::fprintf(stderr, "krab: %s %s; training goes on without it\n", child->name.c_str(),
                     how.c_str());
        continue;
      }
      if (code != 0 && !stopping) {
        std::fprintf(stderr, "krab: %s %s; stopping the other %d process(es)\n",
                     child->name.c_str(), how.c_str(), alive);
        result = code == 2 ? 2 : 1;
        stopping = true;
        stop_deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
        stop_all(SIGTERM);
      }
      continue;
    }
    if (g_signal && !stopping) {
      std::fprintf(stderr, "krab: interrupted; stopping %d process(es)\n", alive);
      result = 130;
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      stop_all(SIGTERM);
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) stop_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace krab::cli
