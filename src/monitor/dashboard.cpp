#include "monitor/dashboard.h"

#include "train/bottleneck.h"

namespace krab::monitor {
namespace {

nlohmann::json gauge_or_null(const std::vector<Snapshot>& ranks, const std::string& name) {
  for (const Snapshot& s : ranks)  // ordered by rank: rank 0's value first
    if (auto it = s.gauges.find(name); it != s.gauges.end()) return it->second;
  return nullptr;
}

double counter(const Snapshot& s, const std::string& name) {
  auto it = s.counters.find(name);
  return it == s.counters.end() ? 0 : it->second;
}

double comm_bytes(const Snapshot& s) {
  double sum = 0;
  for (const auto& [name, value] : s.counters)
    if (name.rfind("comm.bytes.", 0) == 0) sum += value;
  return sum;
}

// The phase totals of `now` since `before` (null: since the start).
train::PhaseTotals phase_growth(const Snapshot& now, const Snapshot* before) {
  train::PhaseTotals t;
  for (const auto& [span, seconds] : now.phases) {
    const int p = train::phase_index(span);
    if (p < 0) continue;
    double earlier = 0;
    if (before != nullptr)
      if (auto it = before->phases.find(span); it != before->phases.end()) earlier = it->second;
    t.seconds[p] = seconds - earlier;
  }
  t.steps = now.step_count - (before != nullptr ? before->step_count : 0);
  return t;
}

}  // namespace

void History::add(double unix_time, const std::vector<Snapshot>& ranks) {
  if (ranks.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const double dt = last_time_ > 0 ? unix_time - last_time_ : 0;
  double samples = 0, bytes = 0;
  bool rates = dt > 0;
  std::vector<train::PhaseTotals> phases;
  for (const Snapshot& s : ranks) {
    auto prev = last_.find(s.rank);
    // A replaced worker (another pid) counts from zero again: no rate from it this time.
    const Snapshot* before =
        prev != last_.end() && prev->second.pid == s.pid ? &prev->second : nullptr;
    if (before == nullptr) rates = false;
    samples += counter(s, "samples") - (before ? counter(*before, "samples") : 0);
    bytes += comm_bytes(s) - (before ? comm_bytes(*before) : 0);
    if (s.rank < 0) continue;
    if (static_cast<size_t>(s.rank) >= phases.size()) phases.resize(s.rank + 1);
    // The breakdown over the last interval; since the start while no step ended in it.
    train::PhaseTotals grown = phase_growth(s, before);
    phases[s.rank] = grown.steps > 0 ? grown : phase_growth(s, nullptr);
  }
  nlohmann::json point{{"t", unix_time},
                       {"loss", gauge_or_null(ranks, "loss")},
                       {"accuracy", gauge_or_null(ranks, "test_accuracy")},
                       {"test_loss", gauge_or_null(ranks, "test_loss")},
                       {"noise_scale", gauge_or_null(ranks, "gradient_noise_scale")},
                       {"global_batch", gauge_or_null(ranks, "global_batch")},
                       {"samples_per_sec", rates ? nlohmann::json(samples / dt) : nullptr},
                       {"bytes_per_sec", rates ? nlohmann::json(bytes / dt) : nullptr}};
  const nlohmann::json workers = gauge_or_null(ranks, "workers");
  point["workers"] = workers.is_null() ? nlohmann::json(ranks.size()) : workers;
  const nlohmann::json generation = gauge_or_null(ranks, "generation");
  point["generation"] = generation.is_null() ? nlohmann::json(0) : generation;
  const nlohmann::json b = train::bottleneck_report(phases, train::RunShape{});
  nlohmann::json rows = nlohmann::json::array();
  for (const Snapshot& s : ranks) {
    nlohmann::json row{{"rank", s.rank}, {"rss_bytes", s.rss_bytes}};
    if (!b.is_null())
      for (const auto& r : b["ranks"])
        if (r["rank"].get<int>() == s.rank)
          for (const auto& [k, v] : r.items())
            if (k != "rank") row[k] = v;
    rows.push_back(std::move(row));
  }
  point["ranks"] = std::move(rows);
  points_.add(std::move(point));
  last_.clear();
  for (const Snapshot& s : ranks) last_[s.rank] = s;
  last_time_ = unix_time;
}

nlohmann::json History::to_json(size_t last) const { return {{"points", points_.last(last)}}; }

Dashboard::Dashboard(Endpoint& endpoint, std::string dir, std::chrono::milliseconds period)
    : dir_(std::move(dir)) {
  serve_live_page(endpoint, dashboard_page(),
                  [history = history_] { return history->to_json().dump(); });
  sampler_ = std::make_unique<Sampler>(
      period, [this](double now) { history_->add(now, read_snapshots(dir_)); });
}

}  // namespace krab::monitor
