// The commands and their options (commands.h).
#include "cli/commands.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>

namespace krab::cli {
namespace {

// A count given on the command line: a whole number >= 1. (CLI::PositiveNumber's message
// prints the largest double, 309 digits, as the bound.)
const CLI::Validator kAtLeastOne(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE || n < 1 || n > 1000000000)
        return "must be a whole number >= 1, got '" + text + "'";
      return "";
    },
    "N>=1");

void add_train_command(CLI::App& app, TrainArgs& args, bool& verbose) {
  auto* train = app.add_subcommand("train", "Train the model a job file describes");
  train->add_option("job", args.job, "Job file (YAML); see docs/config.md")->required();
  train->add_option("--set", args.sets, "Override a key: --set train.steps=100 (repeatable)");
  train->add_option("--report", args.report, "Write a JSON report of the run to FILE");
  train->add_option("--trace", args.trace,
                    "Write a timeline of this node's workers to FILE (Chrome trace-event JSON: "
                    "open it in https://ui.perfetto.dev or chrome://tracing)");
  train->add_option("--progress-file", args.progress_file,
                    "Rewrite FILE with the number of completed steps after every step (for "
                    "scripts that watch a run)");
  train->add_option("--nnodes", args.launch.nnodes, "Number of machines (default 1)");
  train->add_option("--node-rank", args.launch.node_rank, "This machine's index, 0..nnodes-1");
  train
      ->add_option("--nproc-per-node", args.launch.nproc_per_node,
                   "Workers on this machine; wins over parallel.workers (default: parallel.workers "
                   "/ nnodes)")
      ->check(kAtLeastOne);
  train->add_option("--rdzv", args.launch.rdzv,
                    "Rendezvous HOST:PORT, hosted by node 0 (several nodes; one node uses a "
                    "file)");
  train->add_option("--rdzv-backend", args.launch.rdzv_backend,
                    "Where an elastic run across machines keeps its membership: c10d (node 0's "
                    "store at --rdzv; default) or etcd (--rdzv-endpoints; no machine whose loss "
                    "ends the run)");
  train->add_option("--rdzv-endpoints", args.launch.rdzv_endpoints,
                    "etcd's client endpoints HOST:PORT[,HOST:PORT...] (--rdzv-backend etcd)");
  train->add_option("--join", args.launch.join,
                    "Join the running elastic job whose node 0 hosts its rendezvous at HOST:PORT "
                    "(the same job file and job secret; --nproc-per-node workers, default 1)");
  train->add_flag("--verbose", verbose,
                  "After an error in the model's code, print its full traceback too");
  train->add_option("--job-secret-file", args.launch.job_secret_file,
                    "File holding the job secret, the same on every node (or KRAB_JOB_SECRET); "
                    "see README 'Running across machines safely'");
}

CLI::App* add_fl_sim_command(CLI::App& app, SimArgs& sim, bool& verbose) {
  auto* fl_sim = app.add_subcommand(
      "fl-sim", "Federated learning simulated in one process: server and clients on one machine");
  fl_sim->add_option("job", sim.job, "Federated job file (YAML); see docs/config.md")->required();
  fl_sim->add_option("--clients", sim.clients, "Simulated clients (overrides federated.clients)")
      ->check(kAtLeastOne);
  fl_sim->add_option("--set", sim.sets, "Override a key: --set federated.rounds=5 (repeatable)");
  fl_sim->add_option("--report", sim.report, "Write a JSON report of the run to FILE");
  fl_sim->add_flag("--verbose", verbose,
                   "After an error in the model's code, print its full traceback too");
  return fl_sim;
}

CLI::App* add_fl_server_command(CLI::App& app, ServerArgs& srv) {
  auto* fl_server = app.add_subcommand(
      "fl-server", "Federated server: waits for clients, runs rounds, writes the global model");
  fl_server->add_option("job", srv.job, "Federated job file (YAML); see docs/config.md")
      ->required();
  fl_server->add_option("--set", srv.sets, "Override a key (repeatable)");
  fl_server->add_option("--report", srv.report, "Write a JSON report of the run to FILE");
  fl_server->add_option("--port-file", srv.port_file,
                        "Write the port it listens on to FILE (with federated.address HOST:0)");
  return fl_server;
}

CLI::App* add_fl_client_command(CLI::App& app, federated::ClientRunOptions& cli_opts,
                                federated::TokenSources& token, bool& verbose) {
  auto* fl_client = app.add_subcommand(
      "fl-client", "Federated client: trains on local data, sends back only model updates");
  fl_client->add_option("--server", cli_opts.server, "Server HOST:PORT")->required();
  fl_client->add_option("--token-file", token.file,
                        "File holding this client's token (or the environment variable "
                        "KRAB_FL_TOKEN)");
  fl_client->add_option("--token", token.flag,
                        "This client's token on the command line (visible in `ps` to every "
                        "local user: prefer --token-file or KRAB_FL_TOKEN)");
  fl_client
      ->add_option("--ca", cli_opts.ca_file,
                   "PEM file of the CA that signed the server's certificate")
      ->required();
  fl_client->add_option("--data", cli_opts.data,
                        "This client's data: a dataset directory or file (data.path); never "
                        "taken from the server");
  fl_client->add_option("--model", cli_opts.model,
                        "This client's copy of the TorchScript module, when the server's model "
                        "is one (its SHA-256 must match the server's)");
  fl_client->add_option("--partition", cli_opts.partition,
                        "K/N: train on partition K of N of --data (experiments)");
  fl_client->add_option("--cert", cli_opts.cert_file, "PEM client certificate (mutual TLS)");
  fl_client->add_option("--key", cli_opts.key_file, "PEM key of --cert");
  fl_client->add_flag("--require-secure-aggregation", cli_opts.policy.require_secure,
                      "Leave (exit 2) if a round is not securely aggregated");
  fl_client->add_option("--min-local-noise", cli_opts.policy.min_local_noise,
                        "Leave if a round's local DP noise multiplier (noise std / clip) is "
                        "below this (default 0: no minimum)");
  fl_client->add_option("--max-clip", cli_opts.policy.max_clip,
                        "Leave if a round does not clip updates to at most this L2 norm "
                        "(default 0: no bound)");
  fl_client->add_option("--max-weight", cli_opts.policy.max_weight,
                        "Leave if a secure round weights this client's update above this "
                        "(default 1: no bound)");
  fl_client->add_option("--server-name", cli_opts.server_name,
                        "Name the server's certificate must carry, when it is not --server's "
                        "host (e.g. its DNS name while connecting to 127.0.0.1)");
  fl_client->add_option("--retry-s", cli_opts.retry_s,
                        "Keep retrying an unreachable server this long (default 60)");
  fl_client->add_option("--threads", cli_opts.threads, "Intra-op threads (default 1)");
  fl_client->add_flag("--verbose", verbose,
                      "After an error in the model's code, print its full traceback too");
  return fl_client;
}

// `krab privacy epsilon`; returns the `epsilon` subcommand.
CLI::App* add_privacy_command(CLI::App& app, EpsilonArgs& eps) {
  auto* privacy = app.add_subcommand("privacy", "Differential-privacy tools");
  privacy->require_subcommand(1);
  auto* epsilon = privacy->add_subcommand(
      "epsilon", "Print the epsilon a subsampled Gaussian mechanism spends (RDP accountant)");
  epsilon->add_option("--noise-multiplier", eps.noise, "Noise std / clipping norm (sigma)")
      ->required();
  epsilon->add_option("--sampling-rate", eps.rate, "Probability a client (or example) is in a step")
      ->required();
  epsilon->add_option("--steps", eps.steps, "Number of steps (rounds)")->required();
  epsilon->add_option("--delta", eps.delta, "Target delta")->required();
  epsilon->add_option("--conversion", eps.conversion,
                      "RDP to (epsilon, delta): balle2020 (default; Opacus, dp_accounting) or "
                      "mironov2017 (TF Privacy before 2020)");
  return epsilon;
}

// `krab export`.
CLI::App* add_export_command(CLI::App& app, ExportArgs& e) {
  auto* cmd = app.add_subcommand(
      "export",
      "Write model.pt (and model.ts for a TorchScript run) from a run's checkpoint (state.krab "
      "or sharded, any world size)");
  cmd->add_option("RUN_DIR", e.run_dir, "The run directory (checkpoint.dir/NAME)")->required();
  cmd->add_option("--step", e.step, "The checkpoint of this step (default: the latest)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", e.out,
                  "Where to write model.pt (default: RUN_DIR/model.pt); model.ts goes beside it "
                  "with the extension .ts");
  cmd->add_option("--key-file", e.key_file, "The run's checkpoint.hmac_key_file, for a sealed run");
  cmd->add_flag("--trust-code", e.trust_code,
                "Load the run's TorchScript file without inspecting its code (as "
                "model.trust_code)");
  return cmd;
}

}  // namespace

// Every command, in the order `krab --help` lists them.
void add_commands(CLI::App& app, Commands& c) {
  app.require_subcommand(1);
  add_train_command(app, c.train, c.verbose);
  c.fl_sim = add_fl_sim_command(app, c.sim, c.verbose);
  c.fl_server = add_fl_server_command(app, c.server);
  c.fl_client = add_fl_client_command(app, c.client, c.client_token, c.verbose);
  c.export_model = add_export_command(app, c.export_args);
  c.config_doc = app.add_subcommand("config-doc", "Print docs/config.md (every job key)");
  c.privacy_epsilon = add_privacy_command(app, c.epsilon);
}

}  // namespace krab::cli
