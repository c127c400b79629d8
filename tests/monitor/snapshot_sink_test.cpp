// monitor/snapshot_sink.h: what a worker's sink writes is what the launcher reads back; the
// launcher keeps one snapshot per rank.
#include "monitor/snapshot_sink.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace krab::monitor {
namespace {

struct TempDir {
  std::string path;
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "krab-snap-XXXXXX").string();
    path = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(SnapshotSink, WritesWhatTheLoopEmitted) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  {
    SnapshotSink sink(dir.path, {3, ""});
    sink.on_counter("samples", 64);
    sink.on_counter("samples", 64);
    sink.on_counter("comm.bytes.allreduce", 1000);
    sink.on_gauge("loss", 2.0, 1);
    sink.on_gauge("loss", 1.5, 2);
    sink.on_span("step.forward", t0, 0.25);
    sink.on_span("comm.bucket.0", t0, 9);  // not a phase: left out
    sink.on_span("step", t0, 0.003);       // first bucket (<= 0.005)
    // The first span wrote the file already.
    ASSERT_TRUE(std::filesystem::exists(dir.path + "/rank-3.json"));
    sink.on_span("step", t0, 0.75);  // <= 1
    sink.on_span("step", t0, 60);    // +Inf only
  }                                  // the destructor writes the last numbers
  const std::vector<Snapshot> got = read_snapshots(dir.path);
  ASSERT_EQ(got.size(), 1u);
  const Snapshot& s = got[0];
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.member, "");
  EXPECT_EQ(s.pid, static_cast<int64_t>(::getpid()));
  EXPECT_GT(s.unix_time, 1.6e9);
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.counters.at("samples"), 128);
  EXPECT_EQ(s.counters.at("comm.bytes.allreduce"), 1000);
  EXPECT_EQ(s.gauges.at("loss"), 1.5);
  EXPECT_EQ(s.phases.at("step.forward"), 0.25);
  EXPECT_DOUBLE_EQ(s.phases.at("step"), 60.753);
  EXPECT_EQ(s.phases.count("comm.bucket.0"), 0u);
  const std::array<int64_t, 11> counts = {1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2};
  EXPECT_EQ(s.step_counts, counts);
  EXPECT_EQ(s.step_count, 3);
  EXPECT_DOUBLE_EQ(s.step_sum, 60.753);
  EXPECT_GT(s.rss_bytes, 1 << 20);  // this test's own process: some megabytes
  // No temporary is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) ++files, (void)e;
  EXPECT_EQ(files, 1);
}

TEST(SnapshotSink, ElasticMembersWriteByMemberId) {
  TempDir dir;
  {
    SnapshotSink sink(dir.path, {1, "0.1.0"});
    sink.set_rank(0);  // renumbered after a change
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/member-0.1.0.json"));
  const auto got = read_snapshots(dir.path);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rank, 0);
  EXPECT_EQ(got[0].member, "0.1.0");
}

TEST(SnapshotSink, ForeignAndBrokenFilesAreSkipped) {
  TempDir dir;
  std::ofstream(dir.path + "/rank-0.json") << "{\"rank\": 0";  // cut short
  std::ofstream(dir.path + "/notes.txt") << "hello";
  SnapshotSink(dir.path, {1, ""}).flush();
  const auto got = read_snapshots(dir.path);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rank, 1);
  EXPECT_TRUE(read_snapshots(dir.path + "/missing").empty());
  EXPECT_THROW(snapshot_from_json(nlohmann::json{{"rank", 0}}), CorruptData);
}

TEST(SnapshotSink, TheNewestSnapshotOfARankSpeaks) {
  auto snap = [](int rank, double when, int workers) {
    Snapshot s;
    s.rank = rank;
    s.unix_time = when;
    if (workers > 0) s.gauges["workers"] = workers;
    return s;
  };
  // A lost member's stale rank 1, its replacement's rank 1, and a rank 2 from before the
  // group shrank to 2 workers.
  const auto kept =
      latest_per_rank({snap(1, 10, 0), snap(2, 11, 0), snap(0, 20, 2), snap(1, 21, 2)});
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].rank, 0);
  EXPECT_EQ(kept[1].rank, 1);
  EXPECT_EQ(kept[1].unix_time, 21);
}

}  // namespace
}  // namespace krab::monitor
