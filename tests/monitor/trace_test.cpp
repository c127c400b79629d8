// monitor/trace_sink.h and monitor/trace_merge.h: every line of a part is a Chrome trace event
// on the track its name says, times are microseconds on the unix clock that keep the steady
// clock's distances, and the merge of parts (one cut short mid-line) is one loadable JSON file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/errors.h"
#include "monitor/trace_merge.h"
#include "monitor/trace_sink.h"

namespace krab::monitor {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Steady = std::chrono::steady_clock;

class Trace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-trace-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Every line of a part, parsed (a line that does not parse fails the test).
  static std::vector<json> lines_of(const std::string& file) {
    std::vector<json> out;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) out.push_back(json::parse(line));
    return out;
  }
  static std::vector<json> with_phase(const std::vector<json>& events, const std::string& ph) {
    std::vector<json> out;
    for (const json& e : events)
      if (e["ph"] == ph) out.push_back(e);
    return out;
  }

  fs::path dir_;
};

double unix_micros_now() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST_F(Trace, SpansAreCompleteEventsOnTheirTracksInMicroseconds) {
  const Steady::time_point t0 = Steady::now();
  {
    TraceSink sink(path("rank-1.jsonl"), {1, "rank 1 (member 0.1.0)"});
    sink.on_span("step.forward", t0, 0.25);
    sink.on_span("comm.bucket.3", t0 + std::chrono::milliseconds(100), 0.002);
    sink.on_span("membership", t0 + std::chrono::seconds(2), 1.5);
    sink.on_span("checkpoint", t0, -1e-9);  // clock oddity: clamped
  }
  const auto all = lines_of(path("rank-1.jsonl"));
  const auto spans = with_phase(all, "X");
  ASSERT_EQ(spans.size(), 4u);
  for (const json& e : all) EXPECT_EQ(e["pid"], 1);
  EXPECT_EQ(spans[0]["name"], "step.forward");
  EXPECT_EQ(spans[0]["tid"], kPhaseTrack);
  EXPECT_EQ(spans[1]["tid"], kCommTrack);
  EXPECT_EQ(spans[2]["tid"], kMembershipTrack);
  EXPECT_EQ(spans[3]["tid"], kPhaseTrack);
  EXPECT_DOUBLE_EQ(spans[0]["dur"].get<double>(), 250000.0);
  EXPECT_DOUBLE_EQ(spans[1]["dur"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(spans[3]["dur"].get<double>(), 0.0);
  // Distances are the steady clock's, to the nanosecond the text keeps.
  const double ts0 = spans[0]["ts"].get<double>();
  EXPECT_NEAR(spans[1]["ts"].get<double>() - ts0, 100000.0, 0.5);
  EXPECT_NEAR(spans[2]["ts"].get<double>() - ts0, 2000000.0, 0.5);
  // ...and the origin is the unix epoch (t0 was a moment ago).
  EXPECT_NEAR(ts0, unix_micros_now(), 5e6);
  EXPECT_NEAR(unix_micros(t0), ts0, 1.0);
}

TEST_F(Trace, MetadataNamesTheProcessAndItsTracks) {
  { TraceSink sink(path("p.jsonl"), {7, "rank 7 (member 1.3.0)"}); }
  std::map<std::string, std::string> names;  // "process" or "thread <tid>" -> name
  for (const json& e : with_phase(lines_of(path("p.jsonl")), "M")) {
    if (e["name"] == "process_name") names["process"] = e["args"]["name"];
    if (e["name"] == "thread_name")
      names["thread " + std::to_string(e["tid"].get<int>())] = e["args"]["name"];
  }
  EXPECT_EQ(names["process"], "rank 7 (member 1.3.0)");
  EXPECT_EQ(names.size(), 4u);  // the process and its three tracks
  EXPECT_EQ(names.count("thread 2"), 1u);
}

TEST_F(Trace, NotesAreInstantsGaugesCountersAndWhatJsonCannotHoldIsLeftOut) {
  {
    TraceSink sink(path("p.jsonl"), {0, "rank 0"});
    sink.on_note("resumed from \"runs/x\" \xff\xfe");  // quotes and bytes that are not UTF-8
    sink.on_gauge("loss", 0.5, 3);
    sink.on_gauge("loss", std::numeric_limits<double>::quiet_NaN(), 4);
    sink.on_gauge("loss", std::numeric_limits<double>::infinity(), 5);
  }
  const auto all = lines_of(path("p.jsonl"));
  const auto notes = with_phase(all, "i");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0]["tid"], kMembershipTrack);
  EXPECT_EQ(notes[0]["name"], "resumed from \"runs/x\" \xef\xbf\xbd\xef\xbf\xbd");
  const auto counters = with_phase(all, "C");
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0]["name"], "loss");
  EXPECT_DOUBLE_EQ(counters[0]["args"]["value"].get<double>(), 0.5);
}

TEST_F(Trace, AStepReachesTheFileWhenItEnds) {
  TraceSink sink(path("p.jsonl"), {0, "rank 0"});
  const size_t metadata = lines_of(path("p.jsonl")).size();
  sink.on_span("step.forward", Steady::now(), 0.05);
  sink.on_span("step.backward", Steady::now(), 0.05);
  EXPECT_EQ(lines_of(path("p.jsonl")).size(), metadata);  // buffered
  sink.on_span("step", Steady::now(), 0.1);
  // The sink is still open: what a killed worker would leave.
  EXPECT_EQ(lines_of(path("p.jsonl")).size(), metadata + 3);
}

TEST(TrackOf, ByName) {
  EXPECT_EQ(track_of("step"), kPhaseTrack);
  EXPECT_EQ(track_of("evaluation"), kPhaseTrack);
  EXPECT_EQ(track_of("comm.bucket.12"), kCommTrack);
  EXPECT_EQ(track_of("membership"), kMembershipTrack);
  EXPECT_EQ(track_of("op.aten::addmm"), kOpTrack);
  EXPECT_EQ(track_of("communication"), kPhaseTrack);  // only the "comm." prefix
}

TEST_F(Trace, MergeKeepsWholeLinesAndDropsATornLast) {
  const Steady::time_point t0 = Steady::now();
  for (int rank : {0, 1}) {
    TraceSink sink(path(str_cat("rank-", rank, ".jsonl")), {rank, str_cat("rank ", rank)});
    for (int s = 0; s < 3; ++s) sink.on_span("step", t0 + std::chrono::seconds(s), 0.5);
  }
  const size_t per_part = lines_of(path("rank-0.jsonl")).size();
  {  // rank 1 was killed while writing a fourth step
    std::ofstream torn(path("rank-1.jsonl"), std::ios::app);
    torn << R"({"ph":"X","pid":1,"tid":1,"ts":1733)";
  }
  const std::string out = path("out/trace.json");
  fs::create_directories(path("out"));
  const auto parts = list_trace_parts(dir_.string());
  ASSERT_EQ(parts.size(), 2u);
  const MergeStats stats =
      merge_trace_parts({parts[0], path("rank-9-never-started.jsonl"), parts[1]}, out);
  EXPECT_EQ(stats.parts, 2);
  EXPECT_EQ(stats.skipped, 1);
  EXPECT_EQ(stats.events, static_cast<int64_t>(2 * per_part));

  std::ifstream in(out);
  const json trace = json::parse(in);  // throws on anything a viewer would refuse
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  ASSERT_EQ(trace["traceEvents"].size(), 2 * per_part);
  int steps[2] = {0, 0};
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "step") ++steps[e["pid"].get<int>()];
  EXPECT_EQ(steps[0], 3);
  EXPECT_EQ(steps[1], 3);
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::others_read, fs::perms::others_read);
}

TEST_F(Trace, MergeOfNoPartsIsAnEmptyTrace) {
  const MergeStats stats = merge_trace_parts({}, path("t.json"));
  EXPECT_EQ(stats.events, 0);
  std::ifstream in(path("t.json"));
  EXPECT_TRUE(json::parse(in)["traceEvents"].empty());
}

TEST_F(Trace, MergeIntoAMissingDirectoryThrowsNamingIt) {
  try {
    merge_trace_parts({}, "/proc/krab-no-such/trace.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/krab-no-such"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace krab::monitor
