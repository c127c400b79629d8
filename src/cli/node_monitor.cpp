#include "cli/node_monitor.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "cli/private_dir.h"
#include "core/errors.h"
#include "federated/rounds.h"
#include "monitor/dashboard.h"
#include "monitor/endpoint.h"
#include "monitor/exposition.h"
#include "monitor/fl_dashboard.h"
#include "monitor/snapshot_sink.h"

namespace krab::cli {

std::unique_ptr<NodeMonitor> NodeMonitor::start(const core::Config& config) {
  const int port = static_cast<int>(config.get_int("monitor.port"));
  if (port == 0) return nullptr;
  std::unique_ptr<NodeMonitor> m(new NodeMonitor());
  // The endpoint first: its errors are the user's to fix, and nothing is left to clean up.
  m->endpoint_ = std::make_unique<monitor::Endpoint>(config.get_string("monitor.bind"), port);
  m->dashboard_ = config.get_bool("monitor.dashboard");
  if (m->dashboard_) monitor::read_chart_js();  // installed, or refused before training
  // 0700: other users of the machine do not see the snapshots (nor replace them).
  m->dir_ = std::make_unique<PrivateDir>("monitor", "the monitoring snapshots");
  return m;
}

NodeMonitor::~NodeMonitor() {
  page_.reset();
  endpoint_.reset();  // no scrape reads the directory while it goes (dir_ goes last)
}

namespace {

// The line every command with an endpoint prints; every interface includes loopback, the
// address to click on this machine.
void say_where(const monitor::Endpoint& endpoint, bool dashboard = false) {
  const std::string& bind = endpoint.bind();
  const bool any = bind == "0.0.0.0" || bind == "::";
  const bool v6 = !any && bind.find(':') != std::string::npos;
  const std::string host = any ? "127.0.0.1" : (v6 ? "[" + bind + "]" : bind);
  std::fprintf(stderr, "krab: metrics at http://%s:%d/metrics\n", host.c_str(), endpoint.port());
  if (dashboard)
    std::fprintf(stderr, "krab: dashboard at http://%s:%d/\n", host.c_str(), endpoint.port());
}

}  // namespace

void NodeMonitor::serve(int node_rank) {
  const std::string dir = dir_->path, node = std::to_string(node_rank);
  endpoint_->route("/metrics", monitor::kExpositionType, [dir, node] {
    return monitor::render_metrics(monitor::read_snapshots(dir), node);
  });
  if (dashboard_) page_ = std::make_unique<monitor::Dashboard>(*endpoint_, dir_->path);
  say_where(*endpoint_, dashboard_);
}

int NodeMonitor::port() const { return endpoint_->port(); }

struct FlMonitor::State {
  std::mutex mutex;
  monitor::FlRounds rounds;
};

FlMonitor::FlMonitor() : state_(std::make_shared<State>()) {}

FlMonitor::~FlMonitor() {
  page_.reset();
  endpoint_.reset();
}

std::unique_ptr<FlMonitor> FlMonitor::start(const core::Config& config) {
  const int port = static_cast<int>(config.get_int("monitor.port"));
  if (port == 0) return nullptr;
  std::unique_ptr<FlMonitor> m(new FlMonitor());
  m->endpoint_ = std::make_unique<monitor::Endpoint>(config.get_string("monitor.bind"), port);
  m->endpoint_->route("/metrics", monitor::kExpositionType, [state = m->state_] {
    std::lock_guard<std::mutex> lock(state->mutex);
    return monitor::render_fl_metrics(state->rounds);
  });
  const bool dashboard = config.get_bool("monitor.dashboard");
  if (dashboard) m->page_ = std::make_unique<monitor::FlDashboard>(*m->endpoint_);
  say_where(*m->endpoint_, dashboard);
  return m;
}

namespace {

// What the endpoint shows of a round: counts, never the clients' names.
monitor::FlRound counted_round(const federated::RoundRecord& rec) {
  monitor::FlRound r;
  r.round = rec.round;
  r.ok = rec.ok;
  r.available = rec.available;
  r.cohort = static_cast<int64_t>(rec.cohort.size());
  r.counted = static_cast<int64_t>(rec.counted.size());
  r.dropped = static_cast<int64_t>(rec.dropped.size());
  r.rejected = static_cast<int64_t>(rec.rejected.size());
  r.bytes_down = static_cast<double>(rec.bytes_down);
  r.bytes_up = static_cast<double>(rec.bytes_up);
  r.seconds = rec.seconds;
  if (rec.ok) r.mean_loss = rec.mean_loss;
  if (rec.test_accuracy >= 0) r.test_accuracy = rec.test_accuracy;
  r.test_loss = rec.test_loss;
  if (rec.epsilon >= 0) r.epsilon = rec.epsilon;
  return r;
}

}  // namespace

void FlMonitor::observe(const federated::RoundRecord& rec) {
  const monitor::FlRound round = counted_round(rec);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->rounds.add(round);
  }
  if (page_) page_->record(round);
}

}  // namespace krab::cli
