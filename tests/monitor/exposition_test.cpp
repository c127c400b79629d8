// monitor/exposition.h: the Prometheus text of two hand-made ranks, written out in full. The
// phase seconds are binary fractions, so that the bottleneck shares below are exact:
//   rank 0, per step (2 steps of 0.5 s): forward + backward 0.25 (compute 0.5), reduce 0.0625
//     (the least of the two: communication 0.125, waiting 0), data 0.0625 (0.125), optimizer
//     0.0625 (0.125), the rest 0.125;
//   rank 1: compute 0.1875 (0.375), reduce 0.125: communication 0.125 and waiting
//     (0.125 - 0.0625) / 0.5 = 0.125; data, optimizer and other 0.125.
//   Busy (data + compute + optimizer) 0.375 s against 0.3125 s: rank 0 is the slowest.
#include "monitor/exposition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace krab::monitor {
namespace {

Snapshot rank_with(int rank, double backward, double reduce) {
  Snapshot s;
  s.rank = rank;
  s.steps = s.step_count = 2;
  s.step_sum = 1.0;
  for (size_t i = 6; i < kStepBuckets.size(); ++i) s.step_counts[i] = 2;  // 0.5 s each
  s.phases = {{"step", 1.0},           {"step.data", 0.125},
              {"step.forward", 0.25},  {"step.backward", backward},
              {"step.reduce", reduce}, {"step.optimizer", 0.125},
              {"step.after", 0},       {"step.end", 0.125},
              {"comm.bucket.0", 0.5}};
  s.counters = {{"samples", 128}, {"comm.bytes.allreduce", 1000}};
  s.gauges = {{"loss", 0.5}};
  s.rss_bytes = 1048576 * (rank + 1);
  return s;
}

std::vector<Snapshot> two_ranks() {
  std::vector<Snapshot> ranks = {rank_with(0, 0.25, 0.125), rank_with(1, 0.125, 0.25)};
  ranks[0].gauges["samples_per_sec"] = 256;
  ranks[1].counters["comm.bytes.allgather"] = 24;
  return ranks;
}

std::string buckets(int rank) {
  const char* le[] = {"0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                      "0.5",   "1",    "2.5",   "5",    "10"};
  std::string out;
  for (int i = 0; i < 11; ++i)
    out += std::string("krab_train_step_seconds_bucket{node=\"0\",rank=\"") + std::to_string(rank) +
           "\",le=\"" + le[i] + "\"} " + (i < 6 ? "0" : "2") + "\n";
  out += "krab_train_step_seconds_bucket{node=\"0\",rank=\"" + std::to_string(rank) +
         "\",le=\"+Inf\"} 2\n";
  out += "krab_train_step_seconds_sum{node=\"0\",rank=\"" + std::to_string(rank) + "\"} 1\n";
  out += "krab_train_step_seconds_count{node=\"0\",rank=\"" + std::to_string(rank) + "\"} 2\n";
  return out;
}

TEST(Exposition, TwoRanksInFull) {
  const std::string expected =
      "# HELP krab_train_samples_total Examples this rank computed.\n"
      "# TYPE krab_train_samples_total counter\n"
      "krab_train_samples_total{node=\"0\",rank=\"0\"} 128\n"
      "krab_train_samples_total{node=\"0\",rank=\"1\"} 128\n"
      "# HELP krab_train_steps_total Training steps this rank computed.\n"
      "# TYPE krab_train_steps_total counter\n"
      "krab_train_steps_total{node=\"0\",rank=\"0\"} 2\n"
      "krab_train_steps_total{node=\"0\",rank=\"1\"} 2\n"
      "# HELP krab_train_step_seconds Seconds of one training step.\n"
      "# TYPE krab_train_step_seconds histogram\n" +
      buckets(0) + buckets(1) +
      "# HELP krab_train_phase_seconds_total Seconds this rank spent in each phase of its "
      "steps.\n"
      "# TYPE krab_train_phase_seconds_total counter\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"data\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"forward\"} 0.25\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"backward\"} 0.25\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"reduce\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"optimizer\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"after\"} 0\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"0\",phase=\"end\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"data\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"forward\"} 0.25\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"backward\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"reduce\"} 0.25\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"optimizer\"} 0.125\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"after\"} 0\n"
      "krab_train_phase_seconds_total{node=\"0\",rank=\"1\",phase=\"end\"} 0.125\n"
      "# HELP krab_comm_bytes_total Bytes this rank's collectives sent, per collective op.\n"
      "# TYPE krab_comm_bytes_total counter\n"
      "krab_comm_bytes_total{node=\"0\",rank=\"0\",op=\"allreduce\"} 1000\n"
      "krab_comm_bytes_total{node=\"0\",rank=\"1\",op=\"allgather\"} 24\n"
      "krab_comm_bytes_total{node=\"0\",rank=\"1\",op=\"allreduce\"} 1000\n"
      "# HELP krab_train_loss Training loss of the global batch, last shared.\n"
      "# TYPE krab_train_loss gauge\n"
      "krab_train_loss{node=\"0\",rank=\"0\"} 0.5\n"
      "krab_train_loss{node=\"0\",rank=\"1\"} 0.5\n"
      "# HELP krab_train_samples_per_second Examples per second of the whole job since the "
      "warm-up.\n"
      "# TYPE krab_train_samples_per_second gauge\n"
      "krab_train_samples_per_second{node=\"0\",rank=\"0\"} 256\n"
      "# HELP krab_memory_rss_bytes Resident memory of this rank's process.\n"
      "# TYPE krab_memory_rss_bytes gauge\n"
      "krab_memory_rss_bytes{node=\"0\",rank=\"0\"} 1048576\n"
      "krab_memory_rss_bytes{node=\"0\",rank=\"1\"} 2097152\n"
      "# HELP krab_bottleneck_share Fraction of this rank's mean step time in each share "
      "(train/bottleneck.h).\n"
      "# TYPE krab_bottleneck_share gauge\n"
      "krab_bottleneck_share{node=\"0\",rank=\"0\",share=\"compute\"} 0.5\n"
      "krab_bottleneck_share{node=\"0\",rank=\"0\",share=\"communication\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"0\",share=\"waiting\"} 0\n"
      "krab_bottleneck_share{node=\"0\",rank=\"0\",share=\"data\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"0\",share=\"optimizer\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"0\",share=\"other\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"1\",share=\"compute\"} 0.375\n"
      "krab_bottleneck_share{node=\"0\",rank=\"1\",share=\"communication\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"1\",share=\"waiting\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"1\",share=\"data\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"1\",share=\"optimizer\"} 0.125\n"
      "krab_bottleneck_share{node=\"0\",rank=\"1\",share=\"other\"} 0.125\n"
      "# HELP krab_bottleneck_slowest_rank The rank of this node with the most computation, "
      "data and update per step.\n"
      "# TYPE krab_bottleneck_slowest_rank gauge\n"
      "krab_bottleneck_slowest_rank{node=\"0\"} 0\n";
  EXPECT_EQ(render_metrics(two_ranks(), "0"), expected);
}

// Membership gauges come from the newest snapshot that has them (the ranks of the start may
// not have lived through the last change); a run with no step timed has no bottleneck.
TEST(Exposition, ElasticGaugesFromTheNewestSnapshot) {
  Snapshot old_view, new_view;
  old_view.rank = 0;
  old_view.unix_time = 100;
  old_view.gauges = {{"workers", 3}, {"generation", 1}};
  new_view.rank = 1;
  new_view.unix_time = 200;
  new_view.gauges = {{"workers", 2}, {"generation", 2}};
  const std::string text = render_metrics({old_view, new_view}, "n1");
  EXPECT_NE(text.find("# TYPE krab_elastic_workers gauge\nkrab_elastic_workers{node=\"n1\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("krab_elastic_generation{node=\"n1\"} 2\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("krab_bottleneck"), std::string::npos) << text;
  EXPECT_EQ(text.find("krab_train_loss"), std::string::npos) << text;
}

TEST(Exposition, NoSnapshotsNoText) { EXPECT_EQ(render_metrics({}, "0"), ""); }

TEST(Exposition, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Snapshot s;
  const std::string text = render_metrics({s}, "x\"y");
  EXPECT_NE(text.find("krab_train_samples_total{node=\"x\\\"y\",rank=\"0\"} 0\n"),
            std::string::npos)
      << text;
}

TEST(Exposition, ValuesReadBackExactly) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(12345678), "12345678");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(1e21), "1e+21");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::nan("")), "NaN");
  EXPECT_EQ(std::stod(format_value(1.0 / 3)), 1.0 / 3);
}

}  // namespace
}  // namespace krab::monitor

namespace krab::monitor {
namespace {

TEST(Exposition, FederatedRounds) {
  EXPECT_EQ(render_fl_metrics({}),
            "# HELP krab_fl_rounds_total Federated rounds this server ran.\n"
            "# TYPE krab_fl_rounds_total counter\n"
            "krab_fl_rounds_total 0\n"
            "# HELP krab_fl_rounds_failed_total Federated rounds that failed.\n"
            "# TYPE krab_fl_rounds_failed_total counter\n"
            "krab_fl_rounds_failed_total 0\n"
            "# HELP krab_fl_bytes_total Payload bytes of the rounds, per direction.\n"
            "# TYPE krab_fl_bytes_total counter\n"
            "krab_fl_bytes_total{direction=\"down\"} 0\n"
            "krab_fl_bytes_total{direction=\"up\"} 0\n"
            "# HELP krab_fl_round_seconds_total Seconds spent in rounds.\n"
            "# TYPE krab_fl_round_seconds_total counter\n"
            "krab_fl_round_seconds_total 0\n");
  FlRounds r;
  r.rounds = 3;
  r.failed = 1;
  r.last_round = 7;
  r.available = 10;
  r.cohort = 5;
  r.counted = 3;
  r.dropped = 1;
  r.rejected = 1;
  r.bytes_down = 4096;
  r.bytes_up = 2048;
  r.seconds = 1.5;
  r.mean_loss = 0.25;
  r.epsilon = 2.5;
  const std::string text = render_fl_metrics(r);
  for (const char* line :
       {"krab_fl_rounds_total 3\n", "krab_fl_rounds_failed_total 1\n", "krab_fl_round 7\n",
        "krab_fl_clients{state=\"available\"} 10\n", "krab_fl_clients{state=\"cohort\"} 5\n",
        "krab_fl_clients{state=\"counted\"} 3\n", "krab_fl_clients{state=\"dropped\"} 1\n",
        "krab_fl_clients{state=\"rejected\"} 1\n", "krab_fl_bytes_total{direction=\"down\"} 4096\n",
        "krab_fl_round_seconds_total 1.5\n", "krab_fl_train_loss 0.25\n",
        "# TYPE krab_fl_privacy_epsilon gauge\nkrab_fl_privacy_epsilon 2.5\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
  EXPECT_EQ(text.find("krab_fl_test_accuracy"), std::string::npos);  // never evaluated
}

}  // namespace
}  // namespace krab::monitor
