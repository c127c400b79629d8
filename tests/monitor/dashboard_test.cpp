// monitor/dashboard.h: the history's points against rates and breakdowns worked out by hand,
// and the three routes on a loopback endpoint (the page, Chart.js from Debian's package, the
// history of snapshots a sink wrote). The page drawn in a browser: tests/monitor/dashboard.sh.
#include "monitor/dashboard.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <thread>

#include "monitor/endpoint.h"
#include "train/step_phases.h"

namespace krab::monitor {
namespace {

namespace phase = train::phase;

// Rank `rank` after `steps` steps of 0.1 s each: 0.06 s forward+backward, 0.04 s reduce.
Snapshot at(int rank, int64_t pid, int64_t steps, double samples, double bytes) {
  Snapshot s;
  s.rank = rank;
  s.pid = pid;
  s.step_count = s.steps = steps;
  s.counters = {{"samples", samples}, {"comm.bytes.allreduce", bytes}};
  s.phases = {{phase::kStep, 0.1 * steps},
              {phase::kForward, 0.02 * steps},
              {phase::kBackward, 0.04 * steps},
              {phase::kReduce, 0.04 * steps}};
  s.rss_bytes = 1000 + rank;
  return s;
}

TEST(History, RatesAndTheBreakdownOverTheLastInterval) {
  History h;
  Snapshot r0 = at(0, 10, 10, 320, 1e6), r1 = at(1, 11, 10, 320, 1e6);
  r0.gauges["loss"] = 0.9;
  h.add(100, {r0, r1});
  Snapshot r0b = at(0, 10, 30, 960, 3e6), r1b = at(1, 11, 30, 960, 3e6);
  r0b.gauges["loss"] = 0.5;
  r0b.gauges["test_accuracy"] = 0.75;
  // Rank 1 waited in its last 20 steps: 0.05 s more reduce per step than rank 0.
  r1b.phases[phase::kReduce] += 0.05 * 20;
  r1b.phases[phase::kStep] += 0.05 * 20;
  h.add(102, {r0b, r1b});
  const nlohmann::json j = h.to_json();
  ASSERT_EQ(j["points"].size(), 2u);
  const auto& first = j["points"][0];
  EXPECT_TRUE(first["samples_per_sec"].is_null());  // no interval before the first point
  EXPECT_EQ(first["loss"], 0.9);
  const auto& p = j["points"][1];
  EXPECT_EQ(p["t"], 102);
  EXPECT_DOUBLE_EQ(p["samples_per_sec"].get<double>(), (640 + 640) / 2.0);
  EXPECT_DOUBLE_EQ(p["bytes_per_sec"].get<double>(), (2e6 + 2e6) / 2.0);
  EXPECT_EQ(p["loss"], 0.5);
  EXPECT_EQ(p["accuracy"], 0.75);
  EXPECT_EQ(p["workers"], 2);  // the ranks seen: no elastic gauge
  EXPECT_EQ(p["generation"], 0);
  ASSERT_EQ(p["ranks"].size(), 2u);
  // Over the interval: rank 0's step 0.1 s, compute 0.06, communication 0.04 (the least);
  // rank 1's 0.15 s with 0.05 s waiting.
  EXPECT_NEAR(p["ranks"][0]["compute"].get<double>(), 0.6, 1e-9);
  EXPECT_NEAR(p["ranks"][0]["communication"].get<double>(), 0.4, 1e-9);
  EXPECT_NEAR(p["ranks"][1]["waiting"].get<double>(), 0.05 / 0.15, 1e-9);
  EXPECT_EQ(p["ranks"][1]["rss_bytes"], 1001);
}

TEST(History, AReplacedWorkerGivesNoRateAndTheOldestPointsGo) {
  History h(2);
  h.add(1, {at(0, 10, 5, 100, 0)});
  h.add(2, {at(0, 12, 1, 20, 0)});  // another pid: its counters started again
  EXPECT_TRUE(h.to_json()["points"][1]["samples_per_sec"].is_null());
  h.add(3, {at(0, 12, 2, 40, 0)});
  const auto j = h.to_json();
  ASSERT_EQ(j["points"].size(), 2u);  // capacity 2: the first point went
  EXPECT_EQ(j["points"][0]["t"], 2);
  EXPECT_DOUBLE_EQ(j["points"][1]["samples_per_sec"].get<double>(), 20);
  EXPECT_EQ(h.to_json(1)["points"].size(), 1u);
  h.add(4, {});  // no snapshot: no point
  EXPECT_EQ(h.size(), 2u);
}

TEST(Dashboard, ServesThePageChartJsAndTheHistoryOfTheSnapshots) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("krab-dash-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  {
    SnapshotSink sink(dir, {0, ""});
    sink.on_counter("samples", 64);
    sink.on_span(phase::kStep, std::chrono::steady_clock::now(), 0.1);
    sink.flush();
  }
  Endpoint endpoint("127.0.0.1", 0);
  Dashboard dashboard(endpoint, dir, std::chrono::milliseconds(20));
  for (int i = 0; i < 250 && dashboard.history().size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(dashboard.history().size(), 2u);
  httplib::Client client("127.0.0.1", endpoint.port());
  client.set_read_timeout(5);
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<script src=\"/chart.js\"></script>"), std::string::npos);
  auto chart = client.Get("/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_EQ(chart->body, read_chart_js());
  EXPECT_NE(chart->body.find("Chart.js v3"), std::string::npos);
  auto history = client.Get("/api/history");
  ASSERT_TRUE(history);
  const auto j = nlohmann::json::parse(history->body);
  ASSERT_GE(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0]["ranks"][0]["rank"], 0);
  // The same snapshot twice: nothing grew, the rate is 0.
  EXPECT_EQ(j["points"][1]["samples_per_sec"], 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace krab::monitor
