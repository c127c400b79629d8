// The launcher's half of `krab train --trace FILE`: the ranks' parts (monitor/trace_sink.h),
// one event per line, become one Chrome trace file,
//
//   {"traceEvents":[
//   <event>,
//   ...
//   ],"displayTimeUnit":"ms"}
//
// which Perfetto (https://ui.perfetto.dev) and chrome://tracing open. The launcher merges
// after its workers exit, whether they succeeded or not, so a failed run still shows where it
// stopped. A part cut short by a killed worker may end in a torn line; every line is checked
// as JSON and one that is not an object is left out (counted in MergeStats), so the file
// stays loadable. Events stay in the order of their part; the viewers sort by time.
//
// Each node's launcher merges the parts of its own workers into its own FILE; several
// machines give several files, each with its ranks (docs/monitoring.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace krab::monitor {

struct MergeStats {
  int parts = 0;        // part files read
  int64_t events = 0;   // events written
  int64_t skipped = 0;  // lines left out: torn or not a JSON object
};

// Merges `parts` (in this order; a missing one counts as empty: a worker that died before
// opening it) into `out`, written atomically (core/fs.h's AtomicFileWriter, mode 0644): until
// it returns, `out` is untouched. Throws krab::Error naming `out` when it cannot be written.
MergeStats merge_trace_parts(const std::vector<std::string>& parts, const std::string& out);

// The part files (*.jsonl) in `dir`, sorted by name, for merge_trace_parts.
std::vector<std::string> list_trace_parts(const std::string& dir);

}  // namespace krab::monitor
