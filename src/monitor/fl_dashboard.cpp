#include "monitor/fl_dashboard.h"

namespace krab::monitor {
namespace {

nlohmann::json or_null(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

void FlHistory::record(double unix_time, const FlRound& r) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(r.ok ? completed_ : failed_);
  last_round_ = r.round;
  // Rejected clients did send an update: they reported, and the server refused what came.
  rounds_.add({{"t", unix_time},
               {"round", r.round},
               {"ok", r.ok},
               {"available", r.available},
               {"selected", r.cohort},
               {"reported", r.counted + r.rejected},
               {"counted", r.counted},
               {"dropped", r.dropped},
               {"rejected", r.rejected},
               {"bytes_received", r.bytes_up},
               {"bytes_sent", r.bytes_down},
               {"seconds", r.seconds},
               {"train_loss", or_null(r.mean_loss)},
               {"test_accuracy", or_null(r.test_accuracy)},
               {"test_loss", or_null(r.test_loss)},
               {"epsilon", or_null(r.epsilon)},
               {"completed", completed_},
               {"failed", failed_}});
}

void FlHistory::sample(double unix_time) {
  std::lock_guard<std::mutex> lock(mu_);
  points_.add({{"t", unix_time},
               {"completed", completed_},
               {"failed", failed_},
               {"round", last_round_ ? nlohmann::json(*last_round_) : nlohmann::json(nullptr)}});
}

nlohmann::json FlHistory::to_json(size_t last) const {
  return {{"points", points_.last(last)}, {"rounds", rounds_.last(last)}};
}

FlDashboard::FlDashboard(Endpoint& endpoint, std::chrono::milliseconds period) {
  serve_live_page(endpoint, fl_dashboard_page(),
                  [history = history_] { return history->to_json().dump(); });
  sampler_ =
      std::make_unique<Sampler>(period, [history = history_](double now) { history->sample(now); });
}

}  // namespace krab::monitor
