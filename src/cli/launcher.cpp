#include "cli/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/node_agent.h"
#include "core/errors.h"
#include "core/fs.h"
#include "elastic/elastic_engine.h"
#include "elastic/etcd_rendezvous.h"
#include "elastic/local_keeper.h"
#include "elastic/membership_view.h"
#include "elastic/providers/local.h"
#include "elastic/providers/slurm.h"

extern char** environ;

namespace krab::cli {
namespace {

int env_int(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  KRAB_CHECK_ARG(it != env.end(), "environment variable ", key, " is not set");
  char* end = nullptr;
  long v = std::strtol(it->second.c_str(), &end, 10);
  KRAB_CHECK_ARG(end && *end == '\0' && !it->second.empty(), "environment variable ", key, "='",
                 it->second, "' is not an integer");
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

// The launcher's plan, from the flags alone (plan_launch when no launcher started this
// process).
static LaunchPlan plan_launcher(const LaunchFlags& flags, int config_workers) {
  LaunchPlan p;
  p.role = Role::kLauncher;
  if (!flags.join.empty()) {
    KRAB_CHECK_ARG(flags.nnodes == 1 && flags.node_rank == 0 && flags.rdzv.empty(),
                   "--join takes no --nnodes, --node-rank or --rdzv: the running job gives the "
                   "machine its number");
    p.rendezvous = comm::parse_endpoint(flags.join, "--join");
    p.nproc_per_node = p.local_world_size = flags.nproc_per_node > 0 ? flags.nproc_per_node : 1;
    p.node_rank = -1;
    return p;
  }
  KRAB_CHECK_ARG(flags.nnodes >= 1, "--nnodes must be >= 1, got ", flags.nnodes);
  KRAB_CHECK_ARG(flags.node_rank >= 0 && flags.node_rank < flags.nnodes, "--node-rank ",
                 flags.node_rank, " is outside 0..", flags.nnodes - 1);
  const bool etcd = flags.rdzv_backend == "etcd";
  KRAB_CHECK_ARG(etcd || flags.rdzv_backend == "c10d", "--rdzv-backend '", flags.rdzv_backend,
                 "': c10d or etcd");
  KRAB_CHECK_ARG(!etcd || !flags.rdzv_endpoints.empty(),
                 "--rdzv-backend etcd needs --rdzv-endpoints HOST:PORT[,HOST:PORT...] (etcd's "
                 "client URLs)");
  KRAB_CHECK_ARG(etcd || flags.rdzv_endpoints.empty(), "--rdzv-endpoints ", flags.rdzv_endpoints,
                 " is for --rdzv-backend etcd");
  KRAB_CHECK_ARG(!etcd || flags.rdzv.empty(), "--rdzv ", flags.rdzv,
                 ": with --rdzv-backend etcd the machines find node 0's store through etcd");
  KRAB_CHECK_ARG(etcd || flags.nnodes == 1 || !flags.rdzv.empty(),
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
  // etcd: node 0's store is made and announced later (elastic_setup.h).
  p.rendezvous = flags.rdzv.empty() ? comm::Endpoint{"127.0.0.1", 0}
                                    : comm::parse_endpoint(flags.rdzv, "--rdzv");
  p.host_store = flags.node_rank == 0;
  return p;
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
      p.local_rank =
          has(env, "OMPI_COMM_WORLD_LOCAL_RANK") ? env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") : 0;
      p.local_world_size =
          has(env, "OMPI_COMM_WORLD_LOCAL_SIZE") ? env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") : 1;
    } else {
      p.rank = env_int(env, "SLURM_PROCID");
      p.world_size = env_int(env, "SLURM_NTASKS");
      p.local_rank = has(env, "SLURM_LOCALID") ? env_int(env, "SLURM_LOCALID") : 0;
      p.local_world_size =
          has(env, "SLURM_NTASKS_PER_NODE") ? env_int(env, "SLURM_NTASKS_PER_NODE") : 1;
    }
    KRAB_CHECK_ARG(p.world_size >= 1, "world size must be >= 1, got ", p.world_size);
    // An elastic joiner's rank comes from the generation that admits it; RANK is its slot,
    // which an autoscaled run may place past the starting world.
    const bool joiner = has(env, "KRAB_ELASTIC_JOIN");
    KRAB_CHECK_ARG(p.rank >= 0 && (joiner || p.rank < p.world_size), "rank ", p.rank,
                   " is outside 0..", p.world_size - 1);
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
  return plan_launcher(flags, config_workers);
}

namespace {

// A process this launcher owns: one of node 0's parameter servers (sync.mode async) or a
// local worker.
struct Child {
  pid_t pid = -1;    // -1 once it has exited
  std::string name;  // "rank 3", "parameter server 0"
  bool server = false;
  int local = 0;             // worker: its slot on this node
  elastic::MemberId member;  // elastic: <node>.<slot>.<incarnation>
  bool ok = false;           // exited with status 0
};

// Variables spawn_and_supervise sets for each child itself: the launcher's own values (it may
// run under torchrun, say) must not reach the children.
bool set_per_child(const std::string& k) {
  return k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" || k == "LOCAL_WORLD_SIZE" ||
         k == "MASTER_ADDR" || k == "MASTER_PORT" || k == "KRAB_WORKER" || k == "KRAB_PS_SHARD" ||
         k == "KRAB_STORE_FILE" || k == "KRAB_JOB_SECRET" || k == "KRAB_MEMBER_ID" ||
         k == "KRAB_ELASTIC_JOIN" || k == "KRAB_RDZV_ENDPOINTS" || k == "KRAB_RDZV_RUN" ||
         k == "KRAB_TRACE_PART" || k == "KRAB_MONITOR_DIR";
}

// The environment of a child: the launcher's, plan.worker_env where the launcher's does not
// set them, and the torchrun-style variables naming its place in the job (launcher.h).
std::vector<std::string> child_environment(const LaunchPlan& plan, bool server, int shard, int rank,
                                           int local, const std::string& member) {
  std::vector<std::string> envs;
  for (auto& [k, v] : current_environment())
    if (!set_per_child(k)) envs.push_back(k + "=" + v);
  for (auto& [k, v] : plan.worker_env)
    if (!std::getenv(k.c_str())) envs.push_back(k + "=" + v);
  envs.push_back("KRAB_WORKER=1");
  if (server) envs.push_back("KRAB_PS_SHARD=" + std::to_string(shard));
  envs.push_back("RANK=" + std::to_string(rank));
  envs.push_back("LOCAL_RANK=" + std::to_string(local));
  envs.push_back("WORLD_SIZE=" + std::to_string(plan.world_size));
  envs.push_back("LOCAL_WORLD_SIZE=" + std::to_string(plan.nproc_per_node));
  envs.push_back("MASTER_ADDR=" + plan.rendezvous.host);
  if (plan.rendezvous.port > 0)
    envs.push_back("MASTER_PORT=" + std::to_string(plan.rendezvous.port));
  if (!plan.rendezvous.file.empty()) envs.push_back("KRAB_STORE_FILE=" + plan.rendezvous.file);
  // The environment, not the command line: /proc/PID/environ is readable by this user only.
  if (!plan.rendezvous.secret.empty()) envs.push_back("KRAB_JOB_SECRET=" + plan.rendezvous.secret);
  // An elastic worker finds its rank in each generation record by this id (elastic/keeper.h).
  if (!member.empty()) envs.push_back("KRAB_MEMBER_ID=" + member);
  if (!plan.trace_dir.empty() && !server)
    envs.push_back(str_cat("KRAB_TRACE_PART=", plan.trace_dir, "/rank-", rank,
                           member.empty() ? "" : "-" + member, ".jsonl"));
  if (plan.elastic && plan.elastic->etcd) {
    envs.push_back("KRAB_RDZV_ENDPOINTS=" + plan.elastic->etcd_endpoints);
    envs.push_back("KRAB_RDZV_RUN=" + plan.elastic->etcd->run_id());
  }
  if (!plan.monitor_dir.empty()) envs.push_back("KRAB_MONITOR_DIR=" + plan.monitor_dir);
  return envs;
}

// Forks and runs this binary with `argv` and `envs`; the child dies with `launcher`, whatever
// kills it.
pid_t start_child(const std::vector<std::string>& argv, const std::vector<std::string>& envs,
                  const std::string& name, pid_t launcher) {
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw Error(str_cat("cannot fork ", name, ": ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(1);
    ::execve("/proc/self/exe", cargv.data(), cenv.data());
    ::_exit(127);
  }
  return pid;
}

// Node 0's parameter servers first, then the local workers. A SIGTERM or Ctrl-C while
// spawning stops the spawning: supervise() stops the ones already started.
std::vector<Child> start_children(const LaunchPlan& plan, const std::vector<std::string>& argv) {
  const pid_t launcher = ::getpid();
  std::vector<Child> children;
  const int servers = plan.node_rank == 0 ? plan.servers : 0;
  for (int i = 0; i < servers + plan.nproc_per_node; ++i) {
    if (g_signal) break;
    const bool server = i < servers;
    const int local = server ? 0 : i - servers;
    const int rank = plan.node_rank * plan.nproc_per_node + local;
    const std::string name = server ? str_cat("parameter server ", i) : str_cat("rank ", rank);
    const elastic::MemberId member{plan.node_rank, local, 0};
    const std::string id = plan.elastic && !server ? member.str() : "";
    std::vector<std::string> env = child_environment(plan, server, i, rank, local, id);
    if (plan.elastic && plan.elastic->joining) env.push_back("KRAB_ELASTIC_JOIN=1");
    const pid_t pid = start_child(argv, env, name, launcher);
    children.push_back({pid, name, server, local, member});
  }
  return children;
}

// The exit code a child's wait status stands for, and how to say it.
std::pair<int, std::string> describe_exit(int status) {
  if (WIFEXITED(status))
    return {WEXITSTATUS(status), str_cat("exited with code ", WEXITSTATUS(status))};
  if (WIFSIGNALED(status))
    return {1, str_cat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                       ")")};
  return {0, ""};
}

// This binary's absolute path: a Slurm job runs it by name, not as /proc/self/exe of its
// launcher.
std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error(str_cat("cannot read /proc/self/exe: ", std::strerror(errno)));
  return std::string(buf, static_cast<size_t>(n));
}

// Watches the children until every one has exited. The first that fails (or a signal to the
// launcher) stops the others: SIGTERM, then SIGKILL once the grace period has passed. With
// plan.elastic, failures go to the keeper instead (elastic_exit, poll_keeper).
class Supervisor {
 public:
  Supervisor(const LaunchPlan& plan, std::vector<Child> children, double grace_seconds,
             const std::vector<std::string>& argv)
      : plan_(plan),
        argv_(argv),
        children_(std::move(children)),
        grace_(std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000))),
        alive_(static_cast<int>(children_.size())) {
    if (plan_.elastic && plan_.elastic->agent)
      start_agent();
    else if (plan_.elastic)
      start_keeper();
  }

  // The launcher's exit code: 0, the first failure's (2 for bad input, else 1), or the shell's
  // code for the signal that stopped it (128 + signal: 130 for Ctrl-C, 143 for SIGTERM).
  int run() {
    while (alive_ > 0) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        on_exit(pid, status);
        continue;
      }
      if (g_signal && !stopping_) {
        std::fprintf(stderr, "krab: interrupted; stopping %d process(es)\n", alive_);
        stop(128 + g_signal, std::chrono::seconds(3));
      }
      if (keeper_ && !stopping_) poll_keeper(/*force=*/false);
      if (agent_ && !stopping_) poll_agent();
      if (provider_ && !stopping_) poll_provider();
      if (stop_by_ && !stopping_ && std::chrono::steady_clock::now() > *stop_by_) {
        std::fprintf(stderr,
                     "krab: %d worker(s) still running %.0f s after the stop record; "
                     "stopping them\n",
                     alive_, std::chrono::duration<double>(plan_.elastic->start_grace).count());
        stop(1, grace_);
      }
      if (stopping_ && std::chrono::steady_clock::now() > stop_deadline_) signal_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int code = keeper_ && !stopping_  ? elastic_result()
                     : agent_ && !stopping_ ? agent_result()
                                            : result_;
    // Workers the provider started elsewhere (Slurm jobs) are not children: they end here.
    if (provider_) provider_->shutdown();
    return code;
  }

 private:
  void on_exit(pid_t pid, int status) {
    Child* child = nullptr;
    for (Child& c : children_)
      if (c.pid == pid) child = &c;
    if (!child) return;
    child->pid = -1;
    --alive_;
    const auto [code, how] = describe_exit(status);
    child->ok = code == 0 && WIFEXITED(status);
    if (keeper_ && !stopping_ && !child->server && code != 2) {
      elastic_exit(*child, status, how);
      return;
    }
    if (agent_ && !stopping_ && !child->server && code != 2) {
      agent_exit(*child, status, how);
      return;
    }
    if (code != 0 && !stopping_ && plan_.tolerate_worker_loss && !child->server && code != 2 &&
        ++workers_lost_ < plan_.world_size) {
      // Parameter-server training goes on without it (the servers count it out).
      std::fprintf(stderr, "krab: %s %s; training goes on without it\n", child->name.c_str(),
                   how.c_str());
      return;
    }
    if (code != 0 && !stopping_ && plan_.tolerate_server_loss && child->server &&
        child->name != "parameter server 0" && ++servers_lost_ == 1) {
      std::fprintf(stderr, "krab: %s %s; its shard's mirror goes on for it (sync.replicas)\n",
                   child->name.c_str(), how.c_str());
      return;
    }
    if (code != 0 && !stopping_) {
      std::fprintf(stderr, "krab: %s %s; stopping the other %d process(es)\n", child->name.c_str(),
                   how.c_str(), alive_);
      stop(code == 2 ? 2 : 1, grace_);
    }
  }

  // Generation 0: the workers as spawned, in rank order, published at once (workers do not
  // wait for it: they build generation 0's group as without elastic).
  void start_keeper() {
    std::vector<elastic::Member> members;
    for (const Child& c : children_)
      if (!c.server) members.push_back({0, plan_.node_rank, c.local, c.pid, c.member});
    // The other machines' workers, as their launchers number them (their pids are theirs).
    for (int node = 1; node < plan_.elastic->nodes; ++node)
      for (int slot = 0; slot < plan_.nproc_per_node; ++slot)
        members.push_back({0, node, slot, 0, elastic::MemberId{node, slot, 0}});
    keeper_ =
        std::make_unique<elastic::LocalKeeper>(keeper_options(), members, elastic::now_instant());
    next_slot_ = plan_.nproc_per_node;
    write_workers_json();
  }

  // What the keeper of this launcher is built with, from the start or after a takeover.
  elastic::LocalKeeperOptions keeper_options() {
    elastic::LocalKeeperOptions o;
    o.nodes = plan_.elastic->nodes;
    o.admit = plan_.elastic->admit;
    if (plan_.elastic->etcd) {
      o.control_store = plan_.elastic->etcd->fenced_store();
      o.groups = plan_.rendezvous;
    }
    o.keeper = plan_.elastic->keeper;
    o.control = plan_.rendezvous;
    o.store_dir = plan_.elastic->store_dir;
    o.start_grace = plan_.elastic->start_grace;
    o.autoscale = plan_.elastic->autoscale;
    if (o.autoscale && !provider_) {
      if (plan_.elastic->slurm)
        provider_ = std::make_unique<elastic::SlurmProvider>(*plan_.elastic->slurm);
      else
        provider_ = std::make_unique<elastic::LocalProvider>(
            [this](const elastic::WorkerSpec& spec) { return spawn_member(spec); });
    }
    if (o.autoscale) o.capacity = [p = provider_.get()] { return p->capacity(); };
    return o;
  }

  // A worker's exit is the keeper's to judge (status 0 is no death; the others are); it is
  // decided at the next poll, which comes at once so that exits seen together are one record.
  void elastic_exit(const Child& child, int status, const std::string& how) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if ((code != 0 || sig != 0) && !finished_)
      std::fprintf(stderr, "krab: %s (member %s) %s\n", child.name.c_str(),
                   child.member.str().c_str(), how.c_str());
    keeper_->on_child_exit(child.member, code, sig);
    exits_pending_ = true;
    if (code != 0 || sig != 0) replace(child);
    finish_if_done();
  }

  // elastic.replace_dead: a member that died gets a successor in its slot, which asks to join
  // when it is ready (elastic/join/<member>) and receives the state (§2.4, §6.1).
  void replace(const Child& dead) {
    const auto& e = *plan_.elastic;
    bool member = false;
    for (const elastic::Member& m : keeper_->current().members)
      member = member || m.id == dead.member;
    if (!e.replace_dead || !member || finished_ || keeper_->stopped()) return;
    if (restarts_[dead.local] >= e.max_restarts) {
      std::fprintf(stderr,
                   "krab: slot %d was replaced %d times (elastic.max_restarts); the run goes on "
                   "without it\n",
                   dead.local, restarts_[dead.local]);
      return;
    }
    keeper_->expect_joiner(start_successor(dead, "to replace"), dead.local);
  }

  // The next incarnation of `dead`'s slot, started as a joiner (it asks to join when ready).
  elastic::MemberId start_successor(const Child& dead, const char* why) {
    ++restarts_[dead.local];
    elastic::MemberId next = dead.member;
    ++next.incarnation;
    const int rank = plan_.node_rank * plan_.nproc_per_node + dead.local;
    std::vector<std::string> env = child_environment(plan_, false, 0, rank, dead.local, next.str());
    env.push_back("KRAB_ELASTIC_JOIN=1");
    const std::string name = str_cat("member ", next.str());
    const pid_t pid = start_child(argv_, env, name, ::getpid());
    children_.push_back({pid, name, false, dead.local, next});
    ++alive_;
    std::fprintf(stderr, "krab: starting member %s in slot %d %s member %s\n", next.str().c_str(),
                 dead.local, why, dead.member.str().c_str());
    return next;
  }

  // Another machine's launcher (ElasticLaunch::agent, cli/node_agent.h): its workers' exits go
  // to the keeper; one the keeper dropped (or that found itself dropped) rejoins as the next
  // incarnation of its slot; one that died as a member is replaced with elastic.replace_dead.
  void start_agent() {
    agent_ = plan_.elastic->etcd ? std::make_unique<NodeAgent>(plan_.elastic->etcd->store())
                                 : std::make_unique<NodeAgent>(comm::reconnecting_store(
                                       plan_.rendezvous, plan_.elastic->start_grace));
    if (plan_.elastic->joining)
      for (const Child& c : children_) agent_->announce({c.member, c.local});
  }

  void agent_exit(Child& child, int status, const std::string& how) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    agent_->report_exit(child.member, code, sig);
    if (code == 0 && sig == 0) {
      any_ok_ = true;
      return;
    }
    const bool dropped = code == elastic::kExitDropped || dropped_.count(child.member) > 0;
    if (!dropped)
      std::fprintf(stderr, "krab: %s (member %s) %s\n", child.name.c_str(),
                   child.member.str().c_str(), how.c_str());
    const auto newest = agent_->newest();
    if (newest && newest->state == elastic::RecordState::kStop) return;
    if (!dropped && !plan_.elastic->replace_dead) return;
    if (restarts_[child.local] >= plan_.elastic->max_restarts) {
      std::fprintf(stderr, "krab: slot %d was started again %d times (elastic.max_restarts)\n",
                   child.local, restarts_[child.local]);
      return;
    }
    const elastic::MemberId next =
        start_successor(child, dropped ? "to rejoin the run for the dropped" : "to replace");
    agent_->announce({next, child.local});
  }

  // A running worker of this machine that the newest record dropped (the keeper stopped
  // hearing it: a partition, a freeze) may not go on with the old group: it is killed, and
  // agent_exit starts it again as a joiner.
  void poll_agent() {
    if (plan_.elastic->etcd && maybe_take_over()) return;
    const auto newest = agent_->newest();
    if (!newest || newest->state == elastic::RecordState::kStop) return;
    for (const Child& c : children_) {
      if (c.pid < 0 || c.server) continue;
      bool member = false;
      for (const elastic::Member& m : newest->members) member = member || m.id == c.member;
      if (member) {
        admitted_.insert(c.member);
      } else if (admitted_.count(c.member) && dropped_by(*newest, c.member) &&
                 dropped_.insert(c.member).second) {
        std::fprintf(stderr, "krab: generation %lld dropped member %s (%s); it rejoins\n",
                     static_cast<long long>(newest->generation), c.member.str().c_str(),
                     newest->reason.c_str());
        ::kill(c.pid, SIGKILL);
      }
    }
  }

  // The etcd rendezvous: once the leader's lease is gone, campaign (every 500 ms); the winner
  // keeps the membership from now on, its groups in a store of its own (§6.2).
  bool maybe_take_over() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_campaign_) return false;
    next_campaign_ = now + std::chrono::milliseconds(500);
    elastic::EtcdRendezvous& etcd = *plan_.elastic->etcd;
    try {
      if (etcd.leader_present() || !etcd.campaign()) return false;
      const comm::StorePtr store = etcd.store();
      const elastic::GenerationRecord current =
          elastic::read_record(*store, elastic::current_generation(*store));
      const std::vector<int> live = etcd.live_nodes();
      std::vector<int> dead;
      for (const elastic::Member& m : current.members)
        if (std::find(live.begin(), live.end(), m.node) == live.end() &&
            std::find(dead.begin(), dead.end(), m.node) == dead.end())
          dead.push_back(m.node);
      own_store_ = std::make_unique<comm::StoreServer>(
          plan_.elastic->own_address, 0, plan_.elastic->start_grace, plan_.rendezvous.secret);
      elastic::LocalKeeperOptions o = keeper_options();
      o.groups = {plan_.elastic->own_address, own_store_->port(), "", plan_.rendezvous.secret};
      keeper_ = std::make_unique<elastic::LocalKeeper>(o, current, dead, elastic::now_instant());
      agent_.reset();
      std::fprintf(
          stderr, "krab: node %d leads the membership from generation %lld on: %s\n",
          plan_.node_rank, static_cast<long long>(keeper_->current().generation),
          elastic::describe_change(current, keeper_->current(), plan_.elastic->keeper).c_str());
      write_workers_json();
      return true;
    } catch (const std::exception& e) {  // etcd or the takeover failed now: try again later
      std::fprintf(stderr, "krab: node %d could not take the membership over: %s\n",
                   plan_.node_rank, e.what());
      return false;
    }
  }

  // Every worker of this machine has exited: 0 when one of them finished the run.
  int agent_result() {
    if (any_ok_) return 0;
    std::fprintf(stderr,
                 "krab: no worker of this machine finished the run (node %d); the others may "
                 "go on without it\n",
                 plan_.node_rank);
    return 1;
  }

  // elastic.autoscale (§8): an addition is a joiner in a new slot, started by the provider (a
  // child of this launcher, or a Slurm job); a removal the newest member's graceful leave
  // (SIGTERM to it). RUN_DIR/autoscale.json has what the policy measured and decided.
  void scale(const elastic::ScaleDecision& d) {
    std::fprintf(stderr, "krab: autoscale: %s a worker, %d -> %d (%s)\n",
                 elastic::to_string(d.action), d.from, d.to, d.reason.c_str());
    if (d.action == elastic::ScaleAction::kAdd) {
      add_worker();
    } else {
      const elastic::MemberId newest = keeper_->current().members.back().id;
      if (auto it = added_.find(newest); it != added_.end()) {
        provider_->remove(it->second);
      } else {  // one of the starting workers (the additions died): it is a child
        for (const Child& c : children_)
          if (c.pid > 0 && c.member == newest) ::kill(c.pid, SIGTERM);
      }
    }
    core::write_file_atomic(plan_.elastic->run_dir + "/autoscale.json",
                            elastic::autoscale_json(*keeper_->autoscale()));
  }

  void add_worker() {
    const elastic::MemberId member{plan_.node_rank, next_slot_++, 0};
    elastic::WorkerSpec spec{
        member, argv_, child_environment(plan_, false, 0, member.slot, member.slot, member.str())};
    spec.env.push_back("KRAB_ELASTIC_JOIN=1");
    spec.argv[0] = self_exe();
    keeper_->expect_joiner(member, member.slot);
    try {
      const elastic::WorkerHandle handle = provider_->add(spec);
      added_[member] = handle;
      if (plan_.elastic->slurm)
        std::fprintf(stderr,
                     "krab: autoscale: member %s is Slurm job %s (output in %s/slurm-%s.out)\n",
                     member.str().c_str(), handle.id.c_str(), plan_.elastic->run_dir.c_str(),
                     handle.id.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "krab: autoscale: %s\n", e.what());
      keeper_->addition_failed(member);
    }
  }

  // provider local: the addition as a child of this launcher, watched like the others.
  pid_t spawn_member(const elastic::WorkerSpec& spec) {
    const std::string name = str_cat("member ", spec.member.str());
    const pid_t pid = start_child(spec.argv, spec.env, name, ::getpid());
    children_.push_back({pid, name, false, spec.member.slot, spec.member});
    ++alive_;
    return pid;
  }

  // Additions the provider gave up on (a Slurm job pending past elastic.wait_s, or one that
  // ended): one that never joined fails the policy's pending decision; the death of one that
  // did is the heartbeats' to find.
  void poll_provider() {
    for (const elastic::WorkerHandle& gone : provider_->poll()) {
      added_.erase(gone.member);
      if (keeper_->addition_failed(gone.member))
        std::fprintf(stderr, "krab: autoscale: member %s (%s %s) ended before it joined\n",
                     gone.member.str().c_str(), provider_->name(), gone.id.c_str());
    }
  }

  // The run is over once every member of the last generation exited 0: a replacement still
  // waiting to be admitted has nothing to join (and waits on no signal but SIGKILL).
  void finish_if_done() {
    const elastic::GenerationRecord& last = keeper_->current();
    bool done = last.workers() > 0;
    for (const elastic::Member& m : last.members)
      for (const Child& c : children_)
        if (!c.server && c.member == m.id) done = done && c.pid < 0 && c.ok;
    if (!done || finished_) return;
    finished_ = true;
    for (const Child& c : children_)
      if (c.pid > 0) ::kill(c.pid, SIGKILL);
  }

  // Every 100 ms (§6.1), or at once after exits.
  void poll_keeper(bool force) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && !exits_pending_ && now < next_poll_) return;
    next_poll_ = now + std::chrono::milliseconds(100);
    exits_pending_ = false;
    const elastic::GenerationRecord before = keeper_->current();
    const std::optional<elastic::GenerationRecord> record = keeper_->poll(elastic::now_instant());
    if (auto decision = keeper_->take_scale_decision()) scale(*decision);
    if (!record) return;
    std::fprintf(stderr, "krab: %s\n",
                 elastic::describe_change(before, *record, plan_.elastic->keeper).c_str());
    // A member dropped for silence may still run (SIGSTOPped, or stuck): it is no longer in
    // the job, and nothing of it may come back.
    // A proposal's lost members are leavers: they finish the step with the others and exit
    // by themselves (killing one now would break the step the others are in).
    if (record->kind == elastic::RecordKind::kAbort)
      for (const elastic::LostMember& lost : record->lost) {
        for (const Child& c : children_)
          if (c.pid > 0 && !c.server && c.member == lost.id) ::kill(c.pid, SIGKILL);
        if (auto it = added_.find(lost.id); it != added_.end()) provider_->kill(it->second);
      }
    write_workers_json();
    // The members write a checkpoint and exit (§2.5); that is bounded like any of their waits.
    if (record->state == elastic::RecordState::kStop) stop_by_ = now + plan_.elastic->start_grace;
  }

  void write_workers_json() {
    core::write_file_atomic(plan_.elastic->run_dir + "/workers.json",
                            elastic::workers_json(keeper_->current()));
  }

  // Every process has exited. The exits not yet judged are judged first, so that the last
  // generation is the one the workers ended in.
  int elastic_result() {
    if (exits_pending_) poll_keeper(/*force=*/true);
    if (keeper_->autoscale())
      core::write_file_atomic(plan_.elastic->run_dir + "/autoscale.json",
                              elastic::autoscale_json(*keeper_->autoscale()));
    const elastic::GenerationRecord& last = keeper_->current();
    if (keeper_->stopped()) {
      std::string ranks = last.workers() == 1 ? "rank" : "ranks";
      for (const elastic::Member& m : last.members)
        ranks += str_cat(m.rank == 0 ? " " : ", ", m.rank);
      std::fprintf(stderr,
                   "krab: elastic.min_workers %d: %d worker(s) left (%s of generation %lld) "
                   "after waiting elastic.wait_s %g s; %s %s: run again with "
                   "checkpoint.resume: true\n",
                   plan_.elastic->keeper.min_workers, last.workers(), ranks.c_str(),
                   static_cast<long long>(last.generation), plan_.elastic->keeper.wait_s,
                   plan_.elastic->sharded
                       ? "the last periodic checkpoint (checkpoint.every_steps) is in"
                       : "the workers wrote a checkpoint in",
                   plan_.elastic->run_dir.c_str());
      return 1;
    }
    bool all_ok = last.workers() > 0;
    for (const elastic::Member& m : last.members)
      for (const Child& c : children_)
        if (!c.server && c.member == m.id) all_ok = all_ok && c.ok;
    if (all_ok) return result_;
    std::fprintf(stderr, "krab: no worker is left (generation %lld) and the run did not finish\n",
                 static_cast<long long>(last.generation));
    return 1;
  }

  void stop(int result, std::chrono::steady_clock::duration grace) {
    result_ = result;
    stopping_ = true;
    stop_deadline_ = std::chrono::steady_clock::now() + grace;
    signal_all(SIGTERM);
  }

  void signal_all(int sig) {
    for (const Child& c : children_)
      if (c.pid > 0) ::kill(c.pid, sig);
  }

  const LaunchPlan& plan_;
  const std::vector<std::string>& argv_;
  std::vector<Child> children_;
  const std::chrono::steady_clock::duration grace_;
  int alive_;
  int result_ = 0;
  int workers_lost_ = 0;
  int servers_lost_ = 0;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stop_deadline_ = std::chrono::steady_clock::now();
  std::unique_ptr<elastic::LocalKeeper> keeper_;  // plan.elastic on node 0
  std::unique_ptr<NodeAgent> agent_;              // plan.elastic on another machine
  std::unique_ptr<comm::StoreServer> own_store_;  // etcd: the groups' store once it leads
  std::chrono::steady_clock::time_point next_campaign_ = std::chrono::steady_clock::now();
  std::set<elastic::MemberId> admitted_;  // agent: its workers some record listed
  std::set<elastic::MemberId> dropped_;   // agent: its workers a record dropped
  bool any_ok_ = false;                   // agent: one of its workers exited 0
  bool exits_pending_ = false;
  std::optional<std::chrono::steady_clock::time_point> stop_by_;  // after a stop record
  std::chrono::steady_clock::time_point next_poll_ = std::chrono::steady_clock::now();
  std::map<int, int> restarts_;                  // elastic.replace_dead: replacements per slot
  int next_slot_ = 0;                            // autoscale: the slot of the next worker added
  std::unique_ptr<elastic::Provider> provider_;  // autoscale only
  std::map<elastic::MemberId, elastic::WorkerHandle> added_;  // by provider_, not yet gone
  bool finished_ = false;  // every member of the last generation exited 0
};

}  // namespace

int spawn_and_supervise(const LaunchPlan& plan, const std::vector<std::string>& argv,
                        double grace_seconds) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::vector<Child> children = start_children(plan, argv);
  if (children.empty() && g_signal) {
    std::fprintf(stderr, "krab: interrupted before any process was started\n");
    return 128 + g_signal;
  }
  return Supervisor(plan, std::move(children), grace_seconds, argv).run();
}

}  // namespace krab::cli
