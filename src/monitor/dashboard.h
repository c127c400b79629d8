// monitor.dashboard: a live page at `/` of the node's endpoint (monitor/endpoint.h). It draws
// the run as it trains — loss and accuracy, samples/s, each rank's step-time breakdown,
// traffic, memory and membership — with the Chart.js that Debian packages (libjs-chart.js),
// served by the endpoint itself at /chart.js: the page needs no internet.
//
// The launcher samples its workers' snapshots (monitor/snapshot_sink.h) once a second into a
// History (half an hour kept); the page fetches /api/history every second and redraws. A point
// holds rates over the second before it (samples/s and bytes/s from the counters' growth), the
// latest gauges, and each rank's breakdown over the last few seconds (train/bottleneck.h on the
// growth of the phase totals), so the breakdown is live rather than an average since the start.
//
//   {"points": [{"t": unix seconds,
//                "loss", "accuracy", "test_loss", "noise_scale" (the gradient noise scale,
//                train/noise_scale.h): last values (null before the first),
//                "samples_per_sec", "bytes_per_sec": the node's, over the last interval,
//                "workers", "generation": membership (the ranks seen; generation 0 when fixed),
//                "ranks": [{"rank", "rss_bytes", "step_seconds", "compute", "communication",
//                           "waiting", "data", "optimizer", "other"}]}, ...],
//    "node": the node's label}
//
// Nothing secret: the same numbers as /metrics. The pieces it shares with fl-server's page (the
// routes, Chart.js, the sampling thread, the page's frame): monitor/live_page.h.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "monitor/live_page.h"
#include "monitor/snapshot_sink.h"

namespace krab::monitor {

class Endpoint;

// The points the page draws. Thread-safe: the sampler adds, the endpoint's threads read.
class History {
 public:
  explicit History(size_t capacity = 1800) : points_(capacity) {}
  // One point at `unix_time` from this node's snapshots (one per rank), with rates over the
  // time since the previous point. Nothing is added for no snapshot at all.
  void add(double unix_time, const std::vector<Snapshot>& ranks);
  // {"points": [...]}: the last `last` points (the page redraws from them every second: ten
  // minutes by default, what a chart can show).
  nlohmann::json to_json(size_t last = 600) const;
  size_t size() const { return points_.size(); }

 private:
  std::mutex mu_;  // the previous point's numbers: one add() at a time
  PointLog points_;
  double last_time_ = 0;
  std::map<int, Snapshot> last_;  // the previous point's snapshots, by rank
};

// The page (HTML with its script inline; Chart.js from /chart.js).
const std::string& dashboard_page();

// Routes `/`, `/chart.js` and `/api/history` on `endpoint` (serve_live_page: throws as it
// does) and samples the snapshots in `dir` every `period` until destroyed.
class Dashboard {
 public:
  Dashboard(Endpoint& endpoint, std::string dir,
            std::chrono::milliseconds period = std::chrono::milliseconds(1000));
  Dashboard(const Dashboard&) = delete;  // the sampler holds `this`
  Dashboard& operator=(const Dashboard&) = delete;
  const History& history() const { return *history_; }

 private:
  std::string dir_;
  std::shared_ptr<History> history_ = std::make_shared<History>();  // shared with the route
  std::unique_ptr<Sampler> sampler_;  // last: stopped before the rest goes
};

}  // namespace krab::monitor
