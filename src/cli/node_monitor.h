// The launcher's side of monitoring (docs/monitoring.md): with monitor.port > 0, a private
// directory where this node's workers keep their snapshots (monitor/snapshot_sink.h,
// KRAB_MONITOR_DIR) and the endpoint that serves them as /metrics (monitor/endpoint.h).
//
// The launcher starts it before anything else of the run, so that a port in use or a bad
// monitor.bind ends the command (exit 2) before any worker starts, and keeps it until its
// workers are done: the last scrape sees the run's final numbers.
#pragma once

#include <memory>
#include <string>

#include "cli/private_dir.h"
#include "core/config.h"

namespace krab::monitor {
class Dashboard;
class Endpoint;
class FlDashboard;
}  // namespace krab::monitor
namespace krab::federated {
struct RoundRecord;
}

namespace krab::cli {

class NodeMonitor {
 public:
  // Null when monitor.port is 0. Throws krab::InvalidArgument naming monitor.port or
  // monitor.bind when the endpoint cannot listen, or monitor.dashboard when Chart.js is not
  // installed; krab::Error when the directory cannot be made (in TMPDIR, else /tmp).
  static std::unique_ptr<NodeMonitor> start(const core::Config& config);
  // Removes the directory and stops serving.
  ~NodeMonitor();

  // Serves /metrics, every sample labelled node="<node_rank>" (known once the node has
  // joined the job), and with monitor.dashboard the page (monitor/dashboard.h); says where on
  // stderr.
  void serve(int node_rank);
  // What the workers get as KRAB_MONITOR_DIR.
  const std::string& dir() const { return dir_->path; }
  int port() const;

 private:
  NodeMonitor() = default;
  std::unique_ptr<PrivateDir> dir_;  // declared first: removed after the endpoint stops
  bool dashboard_ = false;
  std::unique_ptr<monitor::Endpoint> endpoint_;
  std::unique_ptr<monitor::Dashboard> page_;  // stopped before the endpoint
};

// `krab fl-server` with monitor.port > 0: the same endpoint, serving the rounds' numbers
// (monitor::FlRounds) that observe() is told of, and with monitor.dashboard the server's page
// (monitor/fl_dashboard.h). Started before the server listens, so that a port in use or a
// missing Chart.js is refused before any client is waited for.
class FlMonitor {
 public:
  // Null when monitor.port is 0; throws as NodeMonitor::start does.
  static std::unique_ptr<FlMonitor> start(const core::Config& config);
  ~FlMonitor();
  // What federated::ServerRunOptions::on_round calls; thread-safe with the scrapes.
  void observe(const federated::RoundRecord& round);

 private:
  FlMonitor();
  struct State;
  std::shared_ptr<State> state_;  // shared with the route, which the endpoint may still run
  std::unique_ptr<monitor::Endpoint> endpoint_;
  std::unique_ptr<monitor::FlDashboard> page_;  // stopped before the endpoint
};

}  // namespace krab::cli
