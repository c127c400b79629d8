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
//   krab_train_gradient_noise_scale{rank}     gauge      train/noise_scale.h's B_simple
//   krab_elastic_workers, krab_elastic_generation   gauge   membership (elastic runs)
//   krab_bottleneck_share{rank,share}         gauge      train/bottleneck.h's fractions of
//                                                        this node's ranks, from the start
//   krab_bottleneck_slowest_rank              gauge      its slowest rank
// A family with no sample is left out (a run without evaluation shows no test accuracy).
// Nothing secret and no path: only numbers, ranks, phase and op names, and the node's label.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "monitor/snapshot_sink.h"

namespace krab::monitor {

// The content type of render_metrics()'s text.
inline constexpr const char* kExpositionType = "text/plain; version=0.0.4; charset=utf-8";

// `node`: the value of every sample's `node` label (the launcher's node rank).
std::string render_metrics(const std::vector<Snapshot>& ranks, const std::string& node);

// One round as `krab fl-server` finished it: what its endpoint shows of the round. The command
// fills it from federated::RoundRecord (cli/node_monitor.h), so that monitor/ does not link
// the federated layer.
struct FlRound {
  int64_t round = 0;  // 1 for the first (a resumed server goes on from its checkpoint's)
  bool ok = false;    // false: too few clients counted, the model did not change
  // Clients: available to draw from, drawn (the cohort), counted in the aggregate, dropped out
  // (no update in time, or an error), rejected (an update that was refused).
  int64_t available = 0, cohort = 0, counted = 0, dropped = 0, rejected = 0;
  double bytes_down = 0, bytes_up = 0;  // the round's payloads, to and from clients
  double seconds = 0;
  std::optional<double> mean_loss;                 // the counted clients' (successful rounds)
  std::optional<double> test_accuracy, test_loss;  // when the server evaluated after it
  std::optional<double> epsilon;                   // with DP: spent so far, this round included
};

// `krab fl-server`'s rounds, for its endpoint: totals since the server started and the last
// round's numbers.
struct FlRounds {
  int64_t rounds = 0;  // rounds run by this process, failed ones included
  int64_t failed = 0;
  int64_t last_round = -1;  // the last round's number (a resumed server goes on counting)
  // The last round's clients: available to draw from, drawn, counted in the aggregate, dropped
  // out, rejected (wrong size, NaN, norm above federated.max_update_norm, robust aggregation).
  int64_t available = 0, cohort = 0, counted = 0, dropped = 0, rejected = 0;
  double bytes_down = 0, bytes_up = 0;  // the rounds' payloads, to and from clients
  double seconds = 0;                   // spent in rounds
  std::optional<double> mean_loss, test_accuracy, test_loss, epsilon;  // the latest known

  // Counts `round` in: the totals grow, the last round's numbers are its, and each metric it
  // does not have keeps its latest known value.
  void add(const FlRound& round);
};

// fl-server's families (docs/monitoring.md), none of them labelled by node or rank:
//   krab_fl_rounds_total, krab_fl_rounds_failed_total     counter
//   krab_fl_round                                          gauge   the last round's number
//   krab_fl_clients{state}                                 gauge   available, cohort, counted,
//                                                                  dropped, rejected
//   krab_fl_bytes_total{direction}                         counter down, up
//   krab_fl_round_seconds_total                            counter
//   krab_fl_train_loss, krab_fl_test_accuracy, krab_fl_test_loss,
//   krab_fl_privacy_epsilon                                gauge   when known (epsilon: DP)
// No client names: only counts.
std::string render_fl_metrics(const FlRounds& r);

// A label value as the format writes it between quotes: backslash, double quote and line feed
// escaped.
std::string escape_label(const std::string& value);

// A sample's value: the shortest text that reads back as the same double; NaN, +Inf, -Inf.
std::string format_value(double v);

}  // namespace krab::monitor
