// krab command line: `krab train JOB.yaml [--set key=value ...] [--report FILE]`,
// `krab privacy epsilon --noise-multiplier S --sampling-rate Q --steps T --delta D`,
// `krab fl-sim FED.yaml [--clients N] [--set key=value ...] [--report FILE]`,
// `krab fl-server FED.yaml [--report FILE] [--port-file FILE]`,
// `krab fl-client --server HOST:PORT --token-file FILE --ca CA.pem [--data PATH] [--model FILE]
//   [--partition K/N]` (the token also from KRAB_FL_TOKEN, or --token with a warning),
// `krab config-doc`.
//
// Exit codes: 0 success; 2 bad input (config, flags, data, checkpoint), with one line naming
// the key, file or value; 1 runtime failure (a worker died, a timeout), naming the rank.
//
// The commands and their options are defined in commands.h; this file runs the one given.
#include <c10/util/Exception.h>
#include <glog/logging.h>
#include <malloc.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/elastic_setup.h"
#include "cli/job_agreement.h"
#include "cli/launcher.h"
#include "cli/node_monitor.h"
#include "cli/private_dir.h"
#include "cli/resources.h"
#include "cli/trace_output.h"
#include "comm/factory.h"
#include "comm/store.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "federated/accountant.h"
#include "federated/processes.h"
#include "federated/simulation.h"
#include "federated/tls_files.h"
#include "krab_version.h"  // generated at build time (cmake/krab_version.cmake)
#include "models/forward_error.h"
#include "train/adaptive_batch.h"
#include "train/bottleneck.h"
#include "train/memory_plan.h"
#include "train/model_export.h"
#include "train/options.h"
#include "train/preflight.h"
#include "train/trainer.h"

namespace {

using namespace krab;
using cli::EpsilonArgs;
using cli::ServerArgs;
using cli::SimArgs;
using cli::TrainArgs;

// Prints epsilon alone on stdout (for scripts that compare it with TF Privacy or Opacus) and
// how it was obtained on stderr.
int run_epsilon(const EpsilonArgs& a) {
  KRAB_CHECK_ARG(a.conversion == "balle2020" || a.conversion == "mironov2017",
                 "--conversion must be balle2020 or mironov2017, got '", a.conversion, "'");
  const auto spent = federated::privacy_spent(a.noise, a.rate, a.steps, a.delta,
                                              a.conversion == "balle2020"
                                                  ? federated::RdpConversion::kBalle2020
                                                  : federated::RdpConversion::kMironov2017);
  std::printf("%.6g\n", spent.epsilon);
  std::fprintf(stderr,
               "krab: epsilon %.6g at delta %g after %lld steps (noise multiplier %g, sampling "
               "rate %g; RDP of the subsampled Gaussian, best order %g, %s conversion)\n",
               spent.epsilon, a.delta, static_cast<long long>(a.steps), a.noise, a.rate,
               spent.order, a.conversion.c_str());
  return 0;
}

int run_fl_sim(const SimArgs& a) {
  core::Config config = core::Config::load_file(a.job, a.sets);
  if (a.clients > 0) config.set("federated.clients", std::to_string(a.clients));
  if (!a.report.empty()) core::check_writable_file(a.report, "--report");
  federated::SimulationOptions options;
  options.report_path = a.report;
  const auto report = federated::run_simulation(config, options);
  if (report.contains("metric"))
    std::fprintf(stderr, "krab: %s after %zu rounds, %.1f MB down, %.1f MB up\n",
                 train::describe_test_metric(report).c_str(), report["rounds"].size(),
                 report["bytes_down"].get<double>() / 1e6, report["bytes_up"].get<double>() / 1e6);
  std::fprintf(stderr, "krab: model %s/model.pt\n",
               core::printable_text(train::run_directory(config)).c_str());
  if (!a.report.empty())
    std::fprintf(stderr, "krab: report %s\n", core::printable_text(a.report).c_str());
  return 0;
}

int run_fl_server(const ServerArgs& a) {
  const core::Config config = core::Config::load_file(a.job, a.sets);
  if (!a.report.empty()) core::check_writable_file(a.report, "--report");
  federated::ServerRunOptions options;
  options.report_path = a.report;
  options.port_file = a.port_file;
  const std::unique_ptr<cli::FlMonitor> monitor = cli::FlMonitor::start(config);
  if (monitor)
    options.on_round = [&monitor](const federated::RoundRecord& r) { monitor->observe(r); };
  const auto report = federated::run_fl_server(config, options);
  if (report.contains("metric"))
    std::fprintf(stderr, "krab: %s after %zu rounds\n", train::describe_test_metric(report).c_str(),
                 report["rounds"].size());
  if (!a.report.empty())
    std::fprintf(stderr, "krab: report %s\n", core::printable_text(a.report).c_str());
  return 0;
}

// The job keys the command line itself acts on, read once, as the job is loaded.
struct JobKeys {
  bool async = false;  // sync.mode async: parameter servers, started by krab's own launcher
  bool mpi = false;    // comm.backend mpi: started by mpirun, not by krab's launcher
  int servers = 0;     // sync.servers: parameter servers on node 0 (async)
  std::chrono::milliseconds timeout{0};  // comm.timeout_s: rendezvous and store calls
};

JobKeys read_job_keys(const core::Config& config) {
  JobKeys keys;
  keys.async = config.get_string("sync.mode") == "async";
  keys.mpi = config.get_string("comm.backend") == "mpi";
  keys.servers = static_cast<int>(config.get_int("sync.servers"));
  keys.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.get_float("comm.timeout_s") * 1000));
  return keys;
}

// Every training step allocates and frees the same activation and gradient buffers, several MB
// each. glibc serves those with mmap and gives them back with munmap, so each step pays page
// faults and page clearing again (measured: 18% of a CNN worker's time in the kernel, 10% with
// this). Keep freed memory in the heap instead, as a caching allocator would; a user's own
// GLIBC_TUNABLES for malloc wins.
void keep_freed_memory() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum: blocks up to 32 MiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and stay there when freed
}

// Everything the launcher can check before it spawns a process: the job (data, model,
// checkpoint), the outputs rank 0 will write, and room for the workers in memory.
void check_before_spawning(const TrainArgs& args, const core::Config& config, const JobKeys& keys,
                           const cli::LaunchPlan& plan) {
  const std::string workers_key =
      args.launch.nproc_per_node > 0 ? "--nproc-per-node" : "parallel.workers";
  // First, so that elastic with comm.backend mpi is named as such.
  train::check_elastic_options(config, plan.world_size, workers_key);
  train::check_adaptive_batch_options(config, plan.world_size);
  KRAB_CHECK_ARG(args.launch.rdzv_backend != "etcd" || config.get_bool("elastic.enabled"),
                 "--rdzv-backend etcd keeps the membership of an elastic run: set "
                 "elastic.enabled: true (a fixed world across machines uses --rdzv)");
  KRAB_CHECK_ARG(!keys.mpi,
                 "comm.backend 'mpi' needs the job started by mpirun "
                 "(mpirun -np N krab train JOB.yaml); krab's own launcher uses gloo");
  // Every node writes its own timeline; checked before the model is built for preflight.
  if (!args.trace.empty()) core::check_writable_file(args.trace, "--trace " + args.trace);
  if (args.trace.empty() && config.get_bool("monitor.profile_ops"))
    std::fprintf(stderr,
                 "krab: warning: monitor.profile_ops records into --trace's timeline; without "
                 "--trace FILE nothing is recorded\n");
  // Node 0 also runs sync.servers parameter servers for sync.mode async.
  const int servers = plan.node_rank == 0 && keys.async ? keys.servers : 0;
  // Memory is checked from the configuration and the data alone, before preflight makes any
  // model (train/memory_plan.h, train/preflight.h).
  train::preflight(config, plan.world_size, [&](const data::DataSplits& d) {
    const train::MemoryPlan memory = train::plan_memory(config, d, plan.world_size);
    try {
      cli::check_job_memory(
          plan.nproc_per_node + servers,
          {memory.model, memory.inputs, memory.activations_plain, memory.activations_checkpointed,
           memory.activations_predicted, memory.data_bytes},
          cli::read_memory_budget(), workers_key);
    } catch (const InvalidArgument& e) {
      // The activations were sized for an adaptive batch's largest step (memory_plan.cpp).
      const int64_t max = config.get_int("train.adaptive_batch.max");
      if (max == 0) throw;
      throw InvalidArgument(
          str_cat("train.adaptive_batch.max ", max, " (", max / plan.world_size,
                  " examples per worker in one forward) does not fit: ", e.what()));
    }
  });
  // Only rank 0, on node 0, writes the outputs.
  if (plan.node_rank == 0) {
    core::check_writable_dir(train::run_directory(config), "checkpoint.dir");
    if (!args.report.empty()) core::check_writable_file(args.report, "--report");
  }
  cli::warn_if_oversubscribed(plan.nproc_per_node, cli::usable_cores(), workers_key);
}

// Every node must be about to run the same job (job_agreement.h). Returns where node 0 writes
// its outputs.
cli::Node0Outputs agree_with_other_nodes(const TrainArgs& args, const core::Config& config,
                                         const cli::LaunchPlan& p, const comm::StoreServer* server,
                                         std::chrono::milliseconds timeout) {
  comm::StorePtr store;
  if (server != nullptr) {
    store = server->store();
  } else {
    try {
      store = comm::connect_store(p.rendezvous, timeout);
    } catch (const Timeout& e) {
      throw Timeout(
          str_cat(e.what(), " (--rdzv; is node 0 started? comm.timeout_s sets the wait)"));
    }
  }
  cli::Node0Outputs mine;
  mine.run_dir = std::filesystem::absolute(train::run_directory(config)).string();
  if (!args.report.empty()) mine.report = std::filesystem::absolute(args.report).string();
  return cli::agree_on_job(store, p.node_rank, args.launch.nnodes,
                           cli::job_fingerprint(config, args.launch.nnodes, p.nproc_per_node), mine,
                           p.rendezvous, timeout);
}

// The last lines of a successful run: where the model and the report are. Rank 0 lives on
// node 0 and writes everything there; the other nodes say so rather than nothing. In an
// elastic run rank 0 may end on another machine (node 0 was lost): `rank0_here` says it wrote
// this machine's checkpoint.dir.
void say_where_outputs_are(const TrainArgs& args, const core::Config& config, int node_rank,
                           const cli::Node0Outputs& node0, bool rank0_here) {
  if (node_rank == 0 || rank0_here) {
    std::fprintf(stderr, "krab: checkpoint %s/model.pt\n",
                 core::printable_text(train::run_directory(config)).c_str());
    if (!args.report.empty())
      std::fprintf(stderr, "krab: report %s\n", core::printable_text(args.report).c_str());
    return;
  }
  std::fprintf(stderr, "krab: node %d done; rank 0 wrote the model on node 0: %s/model.pt\n",
               node_rank, node0.run_dir.c_str());
  if (!node0.report.empty())
    std::fprintf(stderr, "krab: report on node 0: %s\n", node0.report.c_str());
  if (!args.report.empty())
    std::fprintf(stderr,
                 "krab: --report %s is not written on this node: only rank 0 writes the report, "
                 "on node 0%s\n",
                 args.report.c_str(), node0.report.empty() ? " (give --report there)" : "");
}

// The job secret (comm/store.h): --job-secret-file's or KRAB_JOB_SECRET's, the same on every
// node; on one node without either, 32 random bytes. Several nodes without one: sync.mode
// async refuses (its parameter servers listen on the network), sync warns.
std::string job_secret(const TrainArgs& args, const JobKeys& keys) {
  std::string secret;
  const char* env = std::getenv("KRAB_JOB_SECRET");
  if (!args.launch.job_secret_file.empty()) {
    secret = core::read_file(args.launch.job_secret_file);
    while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back())))
      secret.pop_back();
  } else if (env != nullptr) {
    secret = env;
  } else if (!args.launch.join.empty()) {
    throw InvalidArgument(str_cat("--join ", args.launch.join,
                                  ": a machine joins with the running job's secret: "
                                  "--job-secret-file FILE or KRAB_JOB_SECRET"));
  } else if (args.launch.nnodes == 1) {
    unsigned char bytes[32];
    FILE* f = std::fopen("/dev/urandom", "rb");
    const bool ok = f != nullptr && std::fread(bytes, 1, sizeof(bytes), f) == sizeof(bytes);
    if (f != nullptr) std::fclose(f);
    if (!ok) throw Error("cannot read /dev/urandom for the job secret");
    static const char* kHex = "0123456789abcdef";
    for (unsigned char b : bytes) secret += {kHex[b >> 4], kHex[b & 15]};
    return secret;
  } else {
    KRAB_CHECK_ARG(!keys.async,
                   "sync.mode 'async' on several nodes needs a job secret, the same on every "
                   "node: --job-secret-file FILE or KRAB_JOB_SECRET (e.g. `openssl rand -hex "
                   "32`); the parameter servers refuse calls without it");
    std::fprintf(stderr,
                 "krab: warning: no job secret (--job-secret-file or KRAB_JOB_SECRET): whoever "
                 "reaches the rendezvous port can read and change the job's keys\n");
    return "";
  }
  KRAB_CHECK_ARG(secret.size() >= 16,
                 args.launch.job_secret_file.empty()
                     ? std::string("KRAB_JOB_SECRET")
                     : "--job-secret-file " + args.launch.job_secret_file,
                 ": the job secret must be at least 16 characters, got ", secret.size());
  return secret;
}

// The rendezvous store this launcher hosts, if any. One node: a FileStore in a private
// directory (`store_dir`), as torch 1.13's TCPStore would listen on every interface
// (comm/store.h). Several nodes: node 0 hosts a TCPStore at --rdzv. Updates p.rendezvous to
// what the workers must reach.
std::unique_ptr<comm::StoreServer> host_rendezvous(const TrainArgs& args, const JobKeys& keys,
                                                   cli::LaunchPlan& p,
                                                   std::unique_ptr<cli::PrivateDir>& store_dir) {
  if (!args.launch.join.empty()) return nullptr;  // the running job's node 0 hosts it
  if (args.launch.nnodes == 1) {
    if (!args.launch.rdzv.empty())
      std::fprintf(stderr,
                   "krab: note: --rdzv %s is not used on one node: the rendezvous is a "
                   "private file (README \"Running across machines safely\")\n",
                   args.launch.rdzv.c_str());
    store_dir = std::make_unique<cli::PrivateDir>("rdzv", "the rendezvous");
    p.rendezvous = {"127.0.0.1", 0, store_dir->path + "/store", p.rendezvous.secret};
    return std::make_unique<comm::StoreServer>(p.rendezvous);
  }
  if (!p.host_store) return nullptr;
  auto server = std::make_unique<comm::StoreServer>(p.rendezvous.host, p.rendezvous.port,
                                                    keys.timeout, p.rendezvous.secret);
  p.rendezvous.port = server->port();
  return server;
}

// Whether `path` was written at or after `since` (a file of this run, not an older one's).
bool wrote_since(const std::string& path, std::filesystem::file_time_type since) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(path, ec);
  return !ec && t >= since;
}

// The launcher's first line: the job, its workers and where they meet.
void say_launching(const TrainArgs& args, const core::Config& config, const cli::LaunchPlan& p,
                   bool joining) {
  if (joining)
    std::fprintf(stderr, "krab: %s — joins the run at %s as node %d with %d worker(s)\n",
                 core::printable_text(args.job).c_str(), p.rendezvous.to_string().c_str(),
                 p.node_rank, p.nproc_per_node);
  else
    std::fprintf(stderr, "krab: %s — %d worker(s)%s, model %s, data %s, rendezvous %s\n",
                 core::printable_text(args.job).c_str(), p.world_size,
                 args.launch.nnodes > 1
                     ? (" on " + std::to_string(args.launch.nnodes) + " nodes").c_str()
                     : "",
                 config.get_string("model.name").c_str(), config.get_string("data.name").c_str(),
                 p.rendezvous.to_string().c_str());
}

// The launcher's last line of a run that succeeded: where this node's outputs are.
void say_done(const TrainArgs& args, const core::Config& config, const cli::LaunchPlan& p,
              const cli::Node0Outputs& node0, bool joining,
              std::filesystem::file_time_type started) {
  if (joining)
    std::fprintf(stderr, "krab: node %d done; rank 0 wrote the model on the job's node 0\n",
                 p.node_rank);
  else if (p.elastic && p.elastic->etcd && p.node_rank != 0 &&
           !wrote_since(train::run_directory(config) + "/model.pt", started))
    std::fprintf(stderr,
                 "krab: node %d done; the last generation's rank 0 wrote model.pt and the "
                 "report in its machine's checkpoint.dir\n",
                 p.node_rank);
  else
    say_where_outputs_are(
        args, config, p.node_rank, node0,
        p.elastic && wrote_since(train::run_directory(config) + "/model.pt", started));
}

int run_launcher(const TrainArgs& args, const core::Config& config, const JobKeys& keys,
                 const cli::LaunchPlan& plan, const std::vector<std::string>& argv) {
  const auto started = std::filesystem::file_time_type::clock::now();
  cli::LaunchPlan p = plan;
  const bool joining = !args.launch.join.empty();
  const cli::Fingerprint mine =
      cli::job_fingerprint(config, args.launch.nnodes, plan.nproc_per_node);
  KRAB_CHECK_ARG(!joining || args.launch.rdzv_backend != "etcd",
                 "--join with --rdzv-backend etcd is not built yet: a machine joins a run of "
                 "the c10d rendezvous (--join HOST:PORT of node 0's --rdzv)");
  if (joining) {  // the job gives this machine its number and world first (elastic_setup.h)
    KRAB_CHECK_ARG(config.get_bool("elastic.enabled"), "--join ", args.launch.join,
                   ": only an elastic run takes machines while it trains; the job file must set "
                   "elastic.enabled: true, as the running job's does");
    p.rendezvous.secret = job_secret(args, keys);
    cli::join_running_job(p, mine, keys.timeout);
  }
  check_before_spawning(args, config, keys, p);
  const std::unique_ptr<cli::NodeMonitor> monitor = cli::NodeMonitor::start(config);
  if (monitor) p.monitor_dir = monitor->dir();
  // torch::set_num_threads() does not reach OpenBLAS, whose own pool (one busy-waiting thread
  // per core by default) would make W workers on few cores fight for them. It reads its
  // limit from the environment once, at load, so the launcher sets it for the workers.
  const std::string threads = std::to_string(config.get_int("train.threads_per_worker"));
  p.worker_env = {{"OPENBLAS_NUM_THREADS", threads}, {"OMP_NUM_THREADS", threads}};
  if (keys.async) {
    p.servers = keys.servers;
    p.tolerate_worker_loss = true;
    p.tolerate_server_loss = config.get_int("sync.replicas") > 0;
  }
  if (!joining) p.rendezvous.secret = job_secret(args, keys);
  std::unique_ptr<cli::PrivateDir> store_dir;
  cli::EtcdSetup etcd;
  const bool use_etcd = args.launch.rdzv_backend == "etcd";
  if (use_etcd)
    etcd = cli::join_etcd_rendezvous(p, args.launch.rdzv_endpoints,
                                     config.get_float("elastic.lease_s"), keys.timeout);
  const std::unique_ptr<comm::StoreServer> server =
      use_etcd ? std::move(etcd.server) : host_rendezvous(args, keys, p, store_dir);
  if (config.get_bool("elastic.enabled")) {
    p.elastic = cli::elastic_launch(config, keys.timeout, store_dir ? store_dir->path : "",
                                    p.world_size, args.launch.nnodes, p.node_rank, mine);
    p.elastic->joining = joining;
    if (use_etcd) {
      p.elastic->etcd = etcd.rendezvous;
      p.elastic->etcd_endpoints = args.launch.rdzv_endpoints;
      p.elastic->own_address = etcd.own_address;
      if (p.elastic->keeper.max_workers == 0) p.elastic->keeper.max_workers = p.world_size;
    }
  }
  cli::Node0Outputs node0;
  if (args.launch.nnodes > 1)
    node0 = agree_with_other_nodes(args, config, p, server.get(), keys.timeout);
  say_launching(args, config, p, joining);
  if (monitor) monitor->serve(p.node_rank);
  const std::unique_ptr<cli::TraceOutput> trace = cli::TraceOutput::start(args.trace, p);
  const int code = cli::spawn_and_supervise(p, argv, 5.0);
  if (code == 0) say_done(args, config, p, node0, joining, started);
  if (trace) trace->write();
  return code;
}

void say_test_metric(const nlohmann::json& report) {
  std::fprintf(stderr, "krab: %s, final loss %s, %s\n", train::describe_test_metric(report).c_str(),
               train::describe_loss(report["final_loss"].get<double>()).c_str(),
               train::describe_samples_per_sec(report).c_str());
}

// The report's bottleneck section, as a few lines (train/bottleneck.h).
void say_bottleneck(const nlohmann::json& report) {
  if (report.contains("bottleneck"))
    for (const std::string& line : train::describe_bottleneck(report["bottleneck"]))
      std::fprintf(stderr, "krab: %s\n", line.c_str());
}

comm::WorldInfo world_of(const cli::LaunchPlan& plan) {
  comm::WorldInfo world;
  world.rank = plan.rank;
  world.size = plan.world_size;
  world.rendezvous = plan.rendezvous;
  return world;
}

// sync.mode async: this process is one of node 0's parameter servers (KRAB_PS_SHARD) or a
// worker, started by krab's own launcher.
int run_async_process(const core::Config& config, const cli::LaunchPlan& plan,
                      const std::map<std::string, std::string>& env,
                      const train::WorkerOptions& options) {
  KRAB_CHECK_ARG(env.count("KRAB_WORKER") > 0,
                 "sync.mode 'async' needs krab's own launcher (it starts the parameter "
                 "servers): run `krab train JOB.yaml`, with --nnodes/--node-rank/--rdzv for "
                 "several machines");
  train::check_async_options(config);
  if (plan.ps_shard >= 0) {
    auto report =
        train::run_param_server(config, plan.ps_shard, plan.rendezvous, plan.world_size, options);
    if (plan.ps_shard == 0 && report.contains("metric")) say_test_metric(report);
    return 0;
  }
  train::run_async_worker(config, world_of(plan), options);
  return 0;
}

// A worker of a synchronous job, started by krab's launcher or another one (torchrun,
// mpirun, Slurm); under another launcher, rank 0 hosts the store.
int run_sync_worker(const core::Config& config, const JobKeys& keys, const cli::LaunchPlan& plan,
                    const train::WorkerOptions& options) {
  std::unique_ptr<comm::StoreServer> server;
  comm::WorldInfo world = world_of(plan);
  world.iface = config.get_string("comm.iface");
  if (plan.host_store && !keys.mpi)
    server = std::make_unique<comm::StoreServer>(plan.rendezvous.host, plan.rendezvous.port,
                                                 keys.timeout, plan.rendezvous.secret);
  auto report = train::run_worker(config, world, options);
  // Rank 0 of the group at the end returns the report (in an elastic run, not always the
  // process that started as rank 0).
  if (report.contains("metric")) say_test_metric(report);
  say_bottleneck(report);
  return 0;
}

// --nproc-per-node wins over the job's parallel.workers, as any command-line value wins over
// the file (and as torchrun's flag of that name decides). Say so when the two disagree, rather
// than train another number of workers than the file says without a word.
void say_which_worker_count_wins(const TrainArgs& args, const core::Config& config,
                                 const cli::LaunchPlan& plan) {
  if (args.launch.nproc_per_node == 0 || !config.is_set("parallel.workers") ||
      config.get_int("parallel.workers") == plan.world_size)
    return;
  std::fprintf(stderr,
               "krab: note: --nproc-per-node %d%s gives %d worker(s), not the job's "
               "parallel.workers: %lld (the command line wins)\n",
               plan.nproc_per_node,
               args.launch.nnodes > 1 ? str_cat(" on ", args.launch.nnodes, " nodes").c_str() : "",
               plan.world_size, static_cast<long long>(config.get_int("parallel.workers")));
}

int run_train(const TrainArgs& args, const std::vector<std::string>& argv) {
  core::Config config = core::Config::load_file(args.job, args.sets);
  const auto env = cli::current_environment();
  const cli::LaunchPlan plan =
      cli::plan_launch(args.launch, static_cast<int>(config.get_int("parallel.workers")), env);
  const JobKeys keys = read_job_keys(config);
  if (plan.role == cli::Role::kLauncher) {
    say_which_worker_count_wins(args, config, plan);
    return run_launcher(args, config, keys, plan, argv);
  }

  // Worker (or parameter server). A peer that dies mid-op must fail the op (EPIPE, then the
  // error naming it, or an elastic recovery), not end this process with SIGPIPE.
  keep_freed_memory();
  ::signal(SIGPIPE, SIG_IGN);
  train::WorkerOptions options;
  options.report_path = args.report;
  options.progress_file = args.progress_file;
  if (auto member = env.find("KRAB_MEMBER_ID"); member != env.end())
    options.member_id = member->second;
  options.joining = env.count("KRAB_ELASTIC_JOIN") > 0 && env.at("KRAB_ELASTIC_JOIN") == "1";
  if (auto etcd = env.find("KRAB_RDZV_ENDPOINTS"); etcd != env.end())
    options.etcd_endpoints = etcd->second;
  if (auto run = env.find("KRAB_RDZV_RUN"); run != env.end()) options.etcd_run = run->second;
  if (auto dir = env.find("KRAB_MONITOR_DIR"); dir != env.end()) options.monitor_dir = dir->second;
  if (auto part = env.find("KRAB_TRACE_PART"); part != env.end()) options.trace_path = part->second;
  if (!args.trace.empty() && options.trace_path.empty() && plan.rank == 0)
    std::fprintf(stderr,
                 "krab: warning: --trace %s is written by krab's own launcher (`krab train` "
                 "without torchrun, mpirun or srun); no timeline is written\n",
                 core::printable_text(args.trace).c_str());
  if (keys.async) return run_async_process(config, plan, env, options);
  return run_sync_worker(config, keys, plan, options);
}

// LibTorch's c10d logs through glog to stderr ("WARNING: Logging before InitGoogleLogging()",
// "E1205 ... socket.cpp:860] The client socket has timed out ...") right before it throws the
// exception krab turns into one line naming the address and the key. Keep only FATAL ones,
// unless the user asked for glog's output with GLOG_minloglevel.
void quiet_library_logs() {
  if (std::getenv("GLOG_minloglevel") == nullptr) FLAGS_minloglevel = google::GLOG_FATAL;
}

std::string g_who = "krab";

// An exception that escapes a thread of ours or a library's (Gloo's EnforceNotMet in its
// progress thread, say) ends in std::terminate: "terminate called after throwing ..." and
// SIGABRT, which the launcher can only report as signal 6. Say what it was, like any other
// error, and exit 1.
[[noreturn]] void on_terminate() {
  std::string what = "terminated without an exception (a bug in krab)";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const c10::Error& x) {
      what = x.what_without_backtrace();
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
      what = "unknown exception";
    }
  }
  what = what.substr(0, what.find('\n'));
  std::fprintf(stderr, "%s: error: %s\n", g_who.c_str(), core::printable_text(what).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// A worker names its rank in every error line, whoever launched it (krab, torchrun,
// mpirun, Slurm).
std::string error_prefix() {
  const char* rank = nullptr;
  for (const char* var : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (rank == nullptr) rank = std::getenv(var);
  const bool worker = std::getenv("KRAB_WORKER") != nullptr || rank != nullptr;
  return worker ? str_cat("krab[rank ", rank ? rank : "?", "]") : std::string("krab");
}

// fl-client: the token from its file, the environment or (with a warning) the command line.
int run_fl_client_command(federated::ClientRunOptions options, federated::TokenSources sources) {
  sources.env = std::getenv("KRAB_FL_TOKEN");
  std::vector<std::string> warnings;
  options.token = federated::client_token(sources, warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "krab: warning: %s\n", w.c_str());
  keep_freed_memory();
  federated::run_fl_client(options);
  return 0;
}

// `krab export`: prints the paths of the files it wrote, one a line.
int run_export(const cli::ExportArgs& a) {
  train::ExportOptions o{a.run_dir, std::nullopt, a.out, a.key_file, a.trust_code};
  if (a.step >= 0) o.step = a.step;
  const train::ExportResult r = train::export_model(o);
  for (const std::string& w : r.warnings) std::cerr << "krab: warning: " << w << "\n";
  std::cout << r.model_pt << "\n";
  if (!r.model_ts.empty()) std::cout << r.model_ts << "\n";
  return 0;
}

// Runs the command `c` holds, once parsed; `train` when no other was given.
int run_command(const cli::Commands& c, int argc, char** argv) {
  if (c.privacy_epsilon->parsed()) return run_epsilon(c.epsilon);
  if (c.fl_server->parsed()) {
    keep_freed_memory();
    return run_fl_server(c.server);
  }
  if (c.fl_client->parsed()) return run_fl_client_command(c.client, c.client_token);
  if (c.fl_sim->parsed()) {
    keep_freed_memory();
    return run_fl_sim(c.sim);
  }
  if (c.export_model->parsed()) return run_export(c.export_args);
  if (c.config_doc->parsed()) {
    std::cout << krab::core::render_markdown();
    return 0;
  }
  std::vector<std::string> pass(argv, argv + argc);
  return run_train(c.train, pass);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"krab — distributed training of neural networks"};
  app.set_version_flag("--version", "krab " KRAB_BUILD_VERSION " (commit " KRAB_BUILD_COMMIT ")");
  cli::Commands commands;
  cli::add_commands(app, commands);
  g_who = error_prefix();
  std::set_terminate(on_terminate);
  quiet_library_logs();
  if (const std::string unknown = cli::unknown_command(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "krab: error: %s\n", unknown.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "krab: error: %s\n", cli::parse_error_message(app, e, argc, argv).c_str());
    return 2;
  }
  try {
    return run_command(commands, argc, argv);
  } catch (const krab::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", g_who.c_str(), core::printable_text(e.what()).c_str());
    const auto* forward = dynamic_cast<const krab::models::ForwardError*>(&e);
    // --verbose: the library's full text (a TorchScript traceback) after the error line.
    if (commands.verbose && forward != nullptr)
      std::fprintf(stderr, "%s\n", forward->details().c_str());
    return e.exit_code();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", g_who.c_str(),
                 core::printable_text(e.what_without_backtrace()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", g_who.c_str(), core::printable_text(e.what()).c_str());
    return 1;
  }
}
