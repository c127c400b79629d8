// monitor.dashboard for `krab fl-server`: a live page at `/` of the server's endpoint
// (cli/node_monitor.h FlMonitor), in the frame the training dashboard uses
// (monitor/live_page.h: Chart.js from Debian's libjs-chart.js at /chart.js, no internet).
//
// It draws what the server knows of the federation, never a client's name:
//   - the rounds completed (and failed) over time, sampled once a second;
//   - per round: the clients selected (the cohort), reported (sent an update: counted or
//     rejected), counted in the aggregate and dropped; the global model's test metric when the
//     server evaluates (federated.eval_data; accuracy, or the loss with train.metric loss) with
//     the counted clients' training loss; the model bytes received from clients and sent to
//     them; the round's seconds; the privacy budget epsilon spent so far (federated.dp).
//
// The server tells the dashboard of each round as it ends (record(): every round is drawn,
// however fast they come); a Sampler adds the time points. The page polls /api/history:
//
//   {"points": [{"t": unix seconds, "completed": successful rounds of this process,
//                "failed": failed rounds, "round": the last round's number or null}, ...],
//    "rounds": [{"t", "round", "ok", "available", "selected", "reported", "counted",
//                "dropped", "rejected", "bytes_received", "bytes_sent", "seconds",
//                "train_loss", "test_accuracy", "test_loss", "epsilon": null when unknown,
//                "completed", "failed": this process's rounds so far, this one included},
//               ...]}
//
// Nothing secret: the same numbers as /metrics, per round.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "monitor/exposition.h"
#include "monitor/live_page.h"

namespace krab::monitor {

class Endpoint;

// The points fl-server's page draws. Thread-safe: the server's thread records, the sampler
// samples, the endpoint's threads read.
class FlHistory {
 public:
  explicit FlHistory(size_t capacity = 1800) : points_(capacity), rounds_(capacity) {}
  // A round ended at `unix_time`.
  void record(double unix_time, const FlRound& round);
  // A time point: the rounds completed until `unix_time`.
  void sample(double unix_time);
  // The JSON above: the last `last` time points and the last `last` rounds.
  nlohmann::json to_json(size_t last = 600) const;
  size_t points() const { return points_.size(); }
  size_t rounds() const { return rounds_.size(); }

 private:
  std::mutex mu_;  // the counts, and the order of their points
  int64_t completed_ = 0, failed_ = 0;
  std::optional<int64_t> last_round_;
  PointLog points_, rounds_;
};

// fl-server's page (HTML with its script inline; Chart.js from /chart.js).
const std::string& fl_dashboard_page();

// Routes `/`, `/chart.js` and `/api/history` on `endpoint` (serve_live_page: throws as it
// does when Chart.js is not installed) and samples every `period` until destroyed.
class FlDashboard {
 public:
  explicit FlDashboard(Endpoint& endpoint,
                       std::chrono::milliseconds period = std::chrono::milliseconds(1000));
  FlDashboard(const FlDashboard&) = delete;
  FlDashboard& operator=(const FlDashboard&) = delete;
  // A round ended now. Thread-safe.
  void record(const FlRound& round) { history_->record(unix_now(), round); }
  const FlHistory& history() const { return *history_; }

 private:
  std::shared_ptr<FlHistory> history_ = std::make_shared<FlHistory>();  // shared with the route
  std::unique_ptr<Sampler> sampler_;  // last: stopped before the rest goes
};

}  // namespace krab::monitor
