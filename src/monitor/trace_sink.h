// TraceSink: one rank's part of `krab train --trace FILE`, a timeline in Chrome's trace-event
// format (the JSON that Perfetto and chrome://tracing open).
//
// The sink streams as events come: each span becomes one complete ("X") event on its own line
// of the part file, through a buffered FILE*, so a run of any length holds no more than the
// buffer in memory. A worker killed mid-run leaves a part whose lines are whole events except,
// at worst, the last one; the launcher's merge (monitor/trace_merge.h) keeps the whole lines
// and drops a torn one. The buffer is flushed when a "step" span arrives (the loop emits it
// when the step has ended, on every rank), so a killed worker loses at most the step it was
// in.
//
// What a part holds, in the trace's terms:
//   pid    the process's row: the rank the launcher started it as (an elastic replacement,
//          which starts in a dead member's slot, gets a row of its own: see TraceProcess)
//   tid 1  the step and its phases (train/step_phases.h); they nest in time, so one track
//          draws them as a flame
//   tid 2  comm.* spans (a DataParallel bucket's reduction, launch to wait): they overlap
//          backward and reduce, so they need a track of their own
//   tid 3  membership changes (elastic) and notes, the latter as instant ("i") events
//   tid 4  op.* spans: LibTorch's operators (monitor.profile_ops, train/op_profile.h); the
//          track is named when its first span comes
//   gauges ("loss", "samples_per_sec", ...) become counter ("C") events of the process, drawn
//          as a curve under its tracks; a gauge that is not finite is left out (JSON has no NaN)
// The first lines are metadata ("M") naming the process and its tracks.
//
// Times: ts and dur are microseconds; ts counts from the unix epoch. Events carry steady-clock
// instants (core/events.h); the sink converts them with one offset between the steady and the
// system clock measured once per process, so parts written on different machines line up as
// well as the machines' clocks agree (NTP: a millisecond or so), and a change of the system
// clock during the run does not bend one rank's timeline.
//
// Thread safety: none, as for every sink (one thread emits). Failures to write (disk full) are
// not reported while training: the part ends early and the merge keeps what is whole.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>

#include "core/events.h"

namespace krab::monitor {

// The tracks (Chrome's "threads") of a rank's process.
inline constexpr int kPhaseTrack = 1;
inline constexpr int kCommTrack = 2;
inline constexpr int kMembershipTrack = 3;
inline constexpr int kOpTrack = 4;  // monitor.profile_ops: LibTorch's operators (op.*)

// The track a span of this name is drawn on: comm.* on kCommTrack, "membership" on
// kMembershipTrack, op.* on kOpTrack, everything else (the step's phases, evaluation,
// checkpoint) on kPhaseTrack.
int track_of(const std::string& span_name);

// Microseconds since the unix epoch of a steady-clock instant, by the process's one offset
// between the two clocks (measured at the first call).
double unix_micros(std::chrono::steady_clock::time_point t);

// The row a part draws in the merged timeline.
struct TraceProcess {
  int pid = 0;       // the launch rank, or another number unique in the run (an elastic
                     // replacement's: rank + 1000 × incarnation, chosen by the trainer)
  std::string name;  // "rank 1", "rank 1 (member 0.1.2)": the row's title
};

class TraceSink : public core::EventSink {
 public:
  // Creates or truncates `path` and writes the metadata lines. Throws krab::Error naming the
  // path when it cannot be opened.
  TraceSink(const std::string& path, TraceProcess process);
  // Flushes and closes the part.
  ~TraceSink() override;
  TraceSink(const TraceSink&) = delete;
  TraceSink& operator=(const TraceSink&) = delete;

  void on_span(const std::string& name, std::chrono::steady_clock::time_point start,
               double seconds) override;
  void on_gauge(const std::string& name, double value, int64_t step) override;
  // An instant event on kMembershipTrack, flushed at once (a note often precedes an exit).
  void on_note(const std::string& text) override;

 private:
  // `name` as a JSON string literal, quotes included; span and gauge names come from a small
  // set, so their escaped forms are kept.
  const std::string& quoted(const std::string& name);
  void write_metadata(const std::string& what, int tid, const std::string& value);

  std::FILE* file_ = nullptr;
  std::string path_;
  int pid_;
  std::unordered_map<std::string, std::string> quoted_;
  bool op_track_named_ = false;
};

// `text` as a JSON string literal (quotes included). Bytes that are not valid UTF-8 become
// U+FFFD, so that a note naming a Latin-1 file keeps the trace loadable.
std::string json_quote(const std::string& text);

}  // namespace krab::monitor
