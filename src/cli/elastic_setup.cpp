#include "cli/elastic_setup.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/errors.h"
#include "elastic/etcd_client.h"
#include "elastic/etcd_rendezvous.h"
#include "elastic/membership_view.h"
#include "elastic/node_requests.h"
#include "elastic/providers/slurm.h"
#include "train/job.h"
#include "train/options.h"

namespace krab::cli {
namespace {

// elastic.autoscale.provider slurm: the clients found in PATH and the controller answering
// (refusals, exit 2, before anything is spawned), and what the provider needs to submit jobs.
elastic::SlurmOptions slurm_options(const core::Config& config, const train::ElasticOptions& e,
                                    const std::string& run_dir) {
  const char* path = std::getenv("PATH");
  elastic::SlurmOptions o;
  o.clients = elastic::find_slurm_clients(path ? path : "");
  // The clients need SLURM_CONF, PATH and the like; none of krab's own variables (a secret
  // the user exported among them). The workers' environment is the Supervisor's to build.
  for (const auto& [k, v] : current_environment())
    if (k.rfind("KRAB_", 0) != 0) o.env.push_back(k + "=" + v);
  // sinfo against a controller that is down fails within its MessageTimeout (10 s by default).
  elastic::check_slurm_controller(o.clients, o.env, std::chrono::seconds(20));
  const std::string name = config.get_string("name");
  o.job_name = "krab-" + (name.empty() ? std::string("job") : name);
  o.run_dir = run_dir;
  o.pending_limit = std::chrono::milliseconds(static_cast<int64_t>(e.wait_s * 1000));
  return o;
}

}  // namespace

ElasticLaunch elastic_launch(const core::Config& config, std::chrono::milliseconds timeout,
                             const std::string& store_dir, int workers, int nodes, int node_rank,
                             const Fingerprint& mine) {
  const train::ElasticOptions e = train::ElasticOptions::from_config(config);
  ElasticLaunch launch;
  launch.keeper.min_workers = e.min_workers;
  launch.keeper.max_workers = e.max_workers;
  launch.keeper.heartbeat_ms = e.heartbeat_ms;
  launch.keeper.dead_after_ms = e.dead_after_ms;
  launch.keeper.wait_s = e.wait_s;
  launch.store_dir = store_dir;
  launch.run_dir = std::filesystem::absolute(train::run_directory(config)).string();
  launch.sharded = config.get_int("parallel.zero_stage") > 0;
  // Generation 0's workers load LibTorch, data and model before their heartbeats begin; they
  // must build their group within comm.timeout_s anyway.
  launch.start_grace = timeout;
  launch.replace_dead = e.replace_dead;
  launch.max_restarts = e.max_restarts;
  if (e.autoscale != "none") {
    elastic::AutoscaleOptions a;
    a.up_efficiency = e.up_efficiency;
    a.down_efficiency = e.down_efficiency;
    a.window_steps = e.window_steps;
    a.cooldown_steps = e.cooldown_steps;
    a.min_workers = e.min_workers;
    a.max_workers = e.max_workers > 0 ? e.max_workers : workers;
    // The global batch is the starting world's for the whole run (§5.1).
    a.examples_per_step = config.get_int("data.batch_size") * workers *
                          std::max<int64_t>(1, config.get_int("train.grad_accum"));
    launch.autoscale = a;
  }
  if (e.autoscale == "slurm") launch.slurm = slurm_options(config, e, launch.run_dir);
  launch.nodes = nodes;
  launch.agent = node_rank != 0;
  if (node_rank == 0 && nodes > 1)
    launch.admit = [theirs_must = without_geometry(mine)](const std::string& text, int node) {
      try {
        return first_difference(theirs_must, without_geometry(decode(text)), node);
      } catch (const std::exception& e) {
        return str_cat("node ", node, "'s job fingerprint could not be read: ", e.what());
      }
    };
  return launch;
}

void join_running_job(LaunchPlan& plan, const Fingerprint& mine,
                      std::chrono::milliseconds timeout) {
  const std::string where = "--join " + plan.rendezvous.to_string();
  comm::StorePtr store;
  try {
    store = comm::connect_store(plan.rendezvous, timeout);
  } catch (const Timeout& e) {
    throw InvalidArgument(str_cat(where, ": nothing answers there within ",
                                  timeout.count() / 1000.0, " s (comm.timeout_s): ", e.what()));
  }
  try {
    // Keys live under the secret's prefix: another secret (or a job not elastic) sees none.
    // A job that started moments ago publishes its first generation within seconds.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (elastic::current_generation(*store) < 0) {
      if (std::chrono::steady_clock::now() > deadline)
        throw InvalidArgument(str_cat(where,
                                      ": no running elastic job there answers to this job secret "
                                      "(--job-secret-file or KRAB_JOB_SECRET)"));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    plan.node_rank = elastic::ask_admission(*store, encode(mine), timeout);
    plan.world_size = elastic::read_record(*store, 0).workers();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {  // the store went away under us: its launcher ended
    throw Error(str_cat(where, ": the job's store closed the connection (the run ended?): ",
                        e.what_without_backtrace()));
  } catch (const std::exception& e) {  // a socket's system_error ("Broken pipe")
    throw Error(
        str_cat(where, ": the job's store closed the connection (the run ended?): ", e.what()));
  }
}

EtcdSetup join_etcd_rendezvous(LaunchPlan& plan, const std::string& endpoints, double lease_s,
                               std::chrono::milliseconds timeout) {
  KRAB_CHECK_ARG(!plan.rendezvous.secret.empty(),
                 "--rdzv-backend etcd needs the job secret (--job-secret-file or "
                 "KRAB_JOB_SECRET): the run's keys in etcd live under it");
  elastic::require_etcd("--rdzv-endpoints " + endpoints, endpoints, timeout, "comm.timeout_s");
  EtcdSetup s;
  const std::string first = elastic::EtcdClient::parse_endpoints(endpoints, "--rdzv-endpoints")[0];
  s.own_address = comm::local_address_towards(first.substr(0, first.rfind(':')));
  s.rendezvous = std::make_shared<elastic::EtcdRendezvous>(elastic::EtcdRendezvousOptions{
      endpoints, plan.rendezvous.secret, plan.node_rank, lease_s, timeout});
  const std::string secret = plan.rendezvous.secret;
  if (plan.node_rank == 0) {
    s.server = std::make_unique<comm::StoreServer>(s.own_address, 0, timeout, secret);
    plan.rendezvous = {s.own_address, s.server->port(), "", secret};
    s.rendezvous->publish_rendezvous(plan.rendezvous);
    KRAB_CHECK(s.rendezvous->campaign(), "node 0 of a new run did not win its leadership");
  } else {
    plan.rendezvous = s.rendezvous->wait_rendezvous(timeout);
    plan.rendezvous.secret = secret;
  }
  return s;
}

}  // namespace krab::cli
