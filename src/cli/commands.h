// The commands `krab` knows, as CLI11 definitions, and the arguments each one fills.
//
//   krab train JOB.yaml [--set key=value ...] [--report FILE] [--trace FILE] [--nnodes N
//   --node-rank K
//                       --rdzv HOST:PORT] [--nproc-per-node N] [--job-secret-file FILE]
//   krab fl-sim FED.yaml [--clients N] [--set key=value ...] [--report FILE]
//   krab fl-server FED.yaml [--set key=value ...] [--report FILE] [--port-file FILE]
//   krab fl-client --server HOST:PORT --ca CA.pem [--token-file FILE | --token T] [--data PATH]
//                  [--model FILE] [--partition K/N] [client policy options ...]
//   krab export RUN_DIR [--step N] [--out FILE] [--key-file FILE]
//   krab config-doc
//   krab privacy epsilon --noise-multiplier S --sampling-rate Q --steps T --delta D
//                        [--conversion balle2020|mironov2017]
//
// add_commands() only defines: it names each command, its options and their help text (what
// `krab --help` and `krab CMD --help` print), and binds every option to a field of a Commands.
// Parsing (CLI::App::parse), turning parse errors into krab's one-line messages
// (command_line.h) and running the command that was given (main.cpp) happen elsewhere.
//
// Values are checked here only as far as the command line can tell: counts (--clients,
// --nproc-per-node) must be whole numbers >= 1, and the options marked required must be
// given. Everything else (does the job file exist, is --conversion a known name) is the
// command's own check when it runs, with exit code 2.
//
// CLI11 is named here only by a forward declaration, so that this header stays cheap to
// include; commands.cpp and main.cpp include <CLI/CLI.hpp> themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/launcher.h"
#include "federated/processes.h"
#include "federated/tls_files.h"

namespace CLI {
class App;
}  // namespace CLI

namespace krab::cli {

// `krab train`.
struct TrainArgs {
  std::string job;                // the job file
  std::vector<std::string> sets;  // --set key=value, in order (later ones win)
  std::string report;             // --report FILE; "" = no report
  std::string progress_file;      // --progress-file FILE; "" = not written
  std::string trace;              // --trace FILE: this node's timeline; "" = none
  LaunchFlags launch;             // --nnodes, --node-rank, --nproc-per-node, --rdzv, ...
};

// `krab fl-sim`.
struct SimArgs {
  std::string job;
  std::vector<std::string> sets;
  std::string report;
  int64_t clients = 0;  // --clients; 0 = the job's federated.clients
};

// `krab fl-server`.
struct ServerArgs {
  std::string job;
  std::vector<std::string> sets;
  std::string report, port_file;  // "" = not written
};

// `krab privacy epsilon`. `conversion` is whatever was given: the command checks the name.
struct EpsilonArgs {
  double noise = 0, rate = 0, delta = 0;
  int64_t steps = 0;
  std::string conversion = "balle2020";
};

// `krab export`: model.pt from a run's checkpoint (train/model_export.h).
struct ExportArgs {
  std::string run_dir;
  int64_t step = -1;        // --step; -1 = the checkpoint `latest` names
  std::string out;          // --out; "" = RUN_DIR/model.pt
  std::string key_file;     // --key-file: the run's checkpoint.hmac_key_file
  bool trust_code = false;  // --trust-code: the model file is loaded without inspection
};

// What the command line holds once parsed: each command's arguments, and which command ran
// (the CLI::App pointers, owned by the app passed to add_commands(), answer parsed()). `train`
// has no pointer: it is the command that ran when no other did.
struct Commands {
  TrainArgs train;
  SimArgs sim;
  ServerArgs server;
  federated::ClientRunOptions client;    // fl-client's options, token aside
  federated::TokenSources client_token;  // --token-file and --token (the environment: main)
  EpsilonArgs epsilon;
  ExportArgs export_args;
  // --verbose, which train, fl-sim and fl-client accept: after an error in the model's code,
  // print the library's full text too (models/forward_error.h).
  bool verbose = false;
  CLI::App* fl_sim = nullptr;
  CLI::App* fl_server = nullptr;
  CLI::App* fl_client = nullptr;
  CLI::App* config_doc = nullptr;
  CLI::App* export_model = nullptr;
  CLI::App* privacy_epsilon = nullptr;
};

// Defines every command on `app`, in the order `krab --help` lists them, with `app` requiring
// exactly one. Binds the options to fields of `c`, and sets c's CLI::App pointers: `app` and
// `c` must both outlive the parse and the checks of which command ran. Call once per app.
void add_commands(CLI::App& app, Commands& c);

}  // namespace krab::cli
