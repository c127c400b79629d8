// A worker's live metrics, kept for the node's monitoring endpoint (monitor/endpoint.h) and
// the dashboard: what the launcher serves while its workers train.
//
// Each worker adds a SnapshotSink to its Events (core/events.h). The sink keeps running totals
// of what the loop emits and, every half second at most, writes them to
// `<dir>/rank-<rank>.json`, where `<dir>` is the launcher's private directory
// (KRAB_MONITOR_DIR); a member of an elastic run writes `<dir>/member-<member id>.json`
// instead, as its rank changes when the group is renumbered. The launcher reads the directory's
// files when someone asks for /metrics. Files, not a socket, because a worker that dies or is
// replaced in an elastic run leaves its last numbers behind without anything to tear down, and the
// launcher needs no protocol of its own to hear from its children.
//
// The file (one JSON object; the dashboard reads the same files):
//   {"rank": 0,                    this process's rank in the group at the time of writing
//    "member": "0.1.0",           elastic member id (<node>.<slot>.<incarnation>), else ""
//    "node": "host-a",            the machine's host name
//    "pid": 4242, "unix_time": 1765111111.5,   the writer and when it wrote
//    "steps": 120,                step spans seen (steps this rank computed)
//    "counters": {"samples": 7680, "comm.bytes.allreduce": 1.2e7},   totals since the start
//    "gauges": {"loss": 0.41, "samples_per_sec": 1530, "workers": 2},  the latest values
//    "phases": {"step": 4.1, "step.forward": 1.2, ...},   seconds summed per span name of
//                                                         train/step_phases.h (not buckets)
//    "step_seconds": {"le": [0.005, ..., 10], "counts": [0, ..., 120],   cumulative counts
//                     "sum": 4.1, "count": 120},          of step spans <= each bound
//    "rss_bytes": 123456789}      resident memory (/proc/self/statm)
// Counters and phases count from the start of this process: a replaced worker starts again
// from zero, as Prometheus expects of a counter whose process restarted.
//
// Nothing in it is secret: no paths, no job secret, no tokens.
// Thread safety: like every sink, called from the training thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/events.h"

namespace krab::monitor {

// Upper bounds (seconds) of the step-time histogram's buckets; +Inf is implied.
inline constexpr std::array<double, 11> kStepBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                        0.5,   1,    2.5,   5,    10};

// One rank's numbers, as the file above holds them.
struct Snapshot {
  int rank = 0;
  std::string member;
  std::string node;
  int64_t pid = 0;
  double unix_time = 0;
  int64_t steps = 0;
  std::map<std::string, double> counters;
  std::map<std::string, double> gauges;
  std::map<std::string, double> phases;
  // counts[i]: step spans of at most kStepBuckets[i] seconds (cumulative, as Prometheus's
  // buckets are); count is the +Inf bucket.
  std::array<int64_t, kStepBuckets.size()> step_counts{};
  double step_sum = 0;
  int64_t step_count = 0;
  int64_t rss_bytes = 0;
};

nlohmann::json to_json(const Snapshot& s);
// Throws krab::CorruptData when a field is missing or of the wrong type.
Snapshot snapshot_from_json(const nlohmann::json& j);

// The snapshots in `dir` (rank-*.json, member-*.json) through latest_per_rank(). A file that
// cannot be read or parsed is skipped (rename keeps a worker's rewrite atomic, but a foreign
// file may be there); a missing directory gives none.
std::vector<Snapshot> read_snapshots(const std::string& dir);

// One snapshot per rank, ordered by rank. Elastic runs leave the files of lost members behind:
// of two snapshots claiming a rank the newer speaks, and ranks at or beyond the newest
// "workers" gauge (the group shrank) are dropped.
std::vector<Snapshot> latest_per_rank(std::vector<Snapshot> all);

// The sink a worker adds when the launcher serves metrics (train/trainer.cpp).
class SnapshotSink : public core::EventSink {
 public:
  struct Identity {
    int rank = 0;
    std::string member;  // elastic member id, "" otherwise
  };
  // Writes into `dir` (which must exist); the first write happens at the first span or step.
  SnapshotSink(std::string dir, Identity who);
  // Writes the final numbers (errors are swallowed: a destructor must not throw).
  ~SnapshotSink() override;

  void on_counter(const std::string& name, double delta) override;
  void on_gauge(const std::string& name, double value, int64_t step) override;
  void on_span(const std::string& name, std::chrono::steady_clock::time_point start,
               double seconds) override;
  void on_step(int64_t done, int64_t total) override;

  // The rank changes in an elastic run when the group is renumbered (the file, named by the
  // member id, stays).
  void set_rank(int rank) { snap_.rank = rank; }
  // Writes now. Throws krab::Error naming the file when it cannot be written.
  void flush();
  const Snapshot& current() const { return snap_; }

 private:
  void maybe_write();

  std::string path_;
  Snapshot snap_;
  std::chrono::steady_clock::time_point last_write_{};
  bool written_ = false;
};

// Time between two writes of a SnapshotSink, at most: Prometheus scrapes every few seconds.
inline constexpr std::chrono::milliseconds kSnapshotPeriod{500};

// The resident memory of this process, in bytes (0 where /proc is not there).
int64_t resident_bytes();

}  // namespace krab::monitor
