// The node's metrics in Prometheus's text exposition format (version 0.0.4): what the
// endpoint's /metrics returns, rendered from the snapshots its workers wrote
// (monitor/snapshot_sink.h). A pure function, so the text is tested without a socket.
//
// Families (docs/monitoring.md says what each one means), every sample labelled with the
// node, and with the rank where it is one rank's:
//   krab_train_samples_total{rank}            counter    examples this rank computed
//   krab_train_steps_total{rank}              counter    steps this rank computed
//   krab_train_step_seconds{rank}             histogram  one step's seconds (_bucket{le},
//                                                        _sum, _count)
//   krab_train_phase_seconds_total{rank,phase} counter   seconds in each step phase
//                                                        (phase = data, forward, backward,
//                                                        reduce, optimizer, after, end,
//                                                        evaluation, checkpoint, membership)
//   krab_comm_bytes_total{rank,op}            counter    bytes this rank's collectives sent
//   krab_train_loss{rank}                     gauge      the global batch's loss, last shared
//   krab_train_samples_per_second{rank}       gauge      the job's rate (rank 0 shows it)
//   krab_train_test_accuracy{rank}, krab_train_test_loss{rank}   gauge  last evaluation
//   krab_memory_rss_bytes{rank}               gauge      resident memory of the process
//   krab_elastic_workers, krab_elastic_generation   gauge   membership (elastic runs)
//   krab_bottleneck_share{rank,share}         gauge      train/bottleneck.h's fractions of
//                                                        this node's ranks, from the start
//   krab_bottleneck_slowest_rank              gauge      its slowest rank
// A family with no sample is left out (a run without evaluation shows no test accuracy).
// Nothing secret and no path: only numbers, ranks, phase and op names, and the node's label.
#pragma once

#include <string>
#include <vector>

#include "monitor/snapshot_sink.h"

namespace krab::monitor {

// The content type of render_metrics()'s text.
inline constexpr const char* kExpositionType = "text/plain; version=0.0.4; charset=utf-8";

// `node`: the value of every sample's `node` label (the launcher's node rank).
std::string render_metrics(const std::vector<Snapshot>& ranks, const std::string& node);

// A label value as the format writes it between quotes: backslash, double quote and line feed
// escaped.
std::string escape_label(const std::string& value);

// A sample's value: the shortest text that reads back as the same double; NaN, +Inf, -Inf.
std::string format_value(double v);

}  // namespace krab::monitor
