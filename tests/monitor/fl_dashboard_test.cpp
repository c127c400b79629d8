// monitor/fl_dashboard.h and monitor/live_page.h: fl-server's history against rounds written
// by hand (what the page draws per round and over time), the totals /metrics shows from the
// same rounds, a sampler that survives a failing sample, and the three routes on a loopback
// endpoint. The page drawn in a browser, with a real federation: tests/monitor/fl_dashboard.sh.
#include "monitor/fl_dashboard.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "monitor/endpoint.h"

namespace krab::monitor {
namespace {

FlRound round_of(int64_t n, bool ok) {
  FlRound r;
  r.round = n;
  r.ok = ok;
  r.available = 5;
  r.cohort = 4;
  r.counted = ok ? 2 : 0;
  r.rejected = 1;
  r.dropped = ok ? 1 : 3;
  r.bytes_down = 4000;
  r.bytes_up = 3000;
  r.seconds = 0.5;
  if (ok) r.mean_loss = 0.7;
  return r;
}

TEST(FlHistory, EveryRoundByNumberAndTheCountsOverTime) {
  FlHistory h;
  h.sample(100);  // before any round: nothing completed, no round number
  FlRound first = round_of(3, true);
  first.test_accuracy = 0.6;
  first.epsilon = 1.5;
  h.record(101, first);
  h.record(101.5, round_of(4, false));
  h.sample(102);
  const nlohmann::json j = h.to_json();
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0],
            (nlohmann::json{{"t", 100}, {"completed", 0}, {"failed", 0}, {"round", nullptr}}));
  EXPECT_EQ(j["points"][1],
            (nlohmann::json{{"t", 102}, {"completed", 1}, {"failed", 1}, {"round", 4}}));
  ASSERT_EQ(j["rounds"].size(), 2u);
  const auto& r = j["rounds"][0];
  EXPECT_EQ(r["round"], 3);
  EXPECT_EQ(r["selected"], 4);
  EXPECT_EQ(r["reported"], 3);  // 2 counted + 1 rejected: both sent an update
  EXPECT_EQ(r["counted"], 2);
  EXPECT_EQ(r["dropped"], 1);
  EXPECT_EQ(r["bytes_received"], 3000);
  EXPECT_EQ(r["bytes_sent"], 4000);
  EXPECT_EQ(r["test_accuracy"], 0.6);
  EXPECT_TRUE(r["test_loss"].is_null());
  EXPECT_EQ(r["epsilon"], 1.5);
  EXPECT_EQ(r["train_loss"], 0.7);
  const auto& failed = j["rounds"][1];
  EXPECT_EQ(failed["ok"], false);
  EXPECT_EQ(failed["completed"], 1);  // so far, as the time points count them
  EXPECT_EQ(failed["failed"], 1);
  EXPECT_TRUE(failed["train_loss"].is_null());
  EXPECT_TRUE(failed["epsilon"].is_null());  // not known for this round: no value, not 0
  EXPECT_EQ(h.to_json(1)["rounds"][0]["round"], 4);
}

TEST(FlRounds, TotalsGrowAndUnknownMetricsKeepTheLatest) {
  FlRounds totals;
  FlRound first = round_of(1, true);
  first.test_accuracy = 0.6;
  first.epsilon = 1.5;
  totals.add(first);
  totals.add(round_of(2, false));
  EXPECT_EQ(totals.rounds, 2);
  EXPECT_EQ(totals.failed, 1);
  EXPECT_EQ(totals.last_round, 2);
  EXPECT_EQ(totals.dropped, 3);  // the last round's
  EXPECT_EQ(totals.bytes_up, 6000);
  EXPECT_DOUBLE_EQ(totals.seconds, 1.0);
  EXPECT_EQ(totals.test_accuracy, 0.6);  // round 2 was not evaluated
  EXPECT_EQ(totals.epsilon, 1.5);
  EXPECT_EQ(totals.mean_loss, 0.7);
}

TEST(Sampler, GoesOnAfterASampleThrows) {
  std::atomic<int> calls{0};
  {
    Sampler s(std::chrono::milliseconds(5), [&calls](double now) {
      EXPECT_GT(now, 1.6e9);  // unix seconds
      if (calls++ == 0) throw std::runtime_error("first sample fails");
    });
    for (int i = 0; i < 400 && calls < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(calls.load(), 3);
}

TEST(FlDashboard, ServesThePageChartJsAndTheRounds) {
  Endpoint endpoint("127.0.0.1", 0);
  FlDashboard dashboard(endpoint, std::chrono::milliseconds(20));
  dashboard.record(round_of(1, true));
  for (int i = 0; i < 250 && dashboard.history().points() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(dashboard.history().points(), 2u);
  httplib::Client client("127.0.0.1", endpoint.port());
  client.set_read_timeout(5);
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->body, fl_dashboard_page());
  EXPECT_NE(page->body.find("<script src=\"/chart.js\"></script>"), std::string::npos);
  for (const char* chart : {"rounds", "clients", "model", "bytes", "privacy", "time"})
    EXPECT_NE(page->body.find(std::string("<canvas id=\"") + chart + "\">"), std::string::npos)
        << chart;
  auto chart = client.Get("/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_EQ(chart->body, read_chart_js());
  auto history = client.Get("/api/history");
  ASSERT_TRUE(history);
  const auto j = nlohmann::json::parse(history->body);
  ASSERT_EQ(j["rounds"].size(), 1u);
  EXPECT_EQ(j["rounds"][0]["selected"], 4);
  EXPECT_EQ(j["points"].back()["completed"], 1);
}

}  // namespace
}  // namespace krab::monitor
