// The run's JSON report, written once for every mode (docs/config.md lists its fields), and the
// event sinks the training loop draws and records through (core/events.h): the progress bar
// and the evaluations/traffic the report keeps.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/events.h"
#include "core/progress.h"

namespace krab::train {

// What every mode reports, whoever measured it (the sync loop's rank 0, the parameter-server
// chief). Engine-specific fields are merged in from `engine_fields`.
struct RunOutcome {
  int workers = 0;
  int64_t global_batch = 0;
  int64_t steps = 0, start_step = 0;
  double epochs = 0;
  double samples_per_sec = 0;
  int64_t measured_steps = 0;  // steps after the measurement warm-up
  double wall_seconds = 0;
  double final_loss = 0;
  // The final evaluation, by train.metric: accuracy (< 0: none), or the mean test loss (set
  // instead of accuracy; the report then says "metric": "loss").
  double test_accuracy = -1;
  std::optional<double> test_loss;
  // The test examples evaluated when train.eval_examples limits them (the report's
  // eval_examples: accuracy or loss on a subset); 0: the whole split, left out.
  int64_t eval_examples = 0;
  double train_seconds = 0;
  nlohmann::json evals = nlohmann::json::array();  // [{step, seconds, test_accuracy|test_loss}]
  uint64_t bytes_sent = 0, bytes_sent_steps = 0;
  nlohmann::json bytes_sent_by_op = nlohmann::json::object();
  uint64_t gradient_bytes = 0;
  std::string sync_mode;
  std::string checkpoint;  // model.pt
  std::string state;       // the last resumable checkpoint ("" when none)
  // The `memory` field (train/memory_report.h), measured and predicted per rank; null: left out.
  nlohmann::json memory;
  // The `bottleneck` section (train/bottleneck.h); null: left out.
  nlohmann::json bottleneck;
  // `gradient_noise_scale` (train/noise_scale.h, rank 0's estimate; runs with monitoring);
  // null: left out.
  nlohmann::json gradient_noise_scale;
};

nlohmann::json make_report(const RunOutcome& outcome, const nlohmann::json& engine_fields,
                           const nlohmann::json& config);

// The report's samples_per_sec: a number, or null with samples_per_sec_note saying why when
// nothing was measured (a run of fewer steps than its warm-up). `measured_steps` counts the
// steps after warm-up.
void set_samples_per_sec(nlohmann::json& report, double samples_per_sec, int64_t measured_steps);

// "1234 samples/s", or "samples/s not measured" for a report whose samples_per_sec is null.
std::string describe_samples_per_sec(const nlohmann::json& report);

// "test accuracy 0.8125" or "test loss 0.0123457": an evaluation of train.metric `metric`
// ("accuracy" | "loss") as the progress output says it.
std::string describe_test_metric(const std::string& metric, double value);
// A report's final evaluation (its "metric" and test_accuracy / test_loss), likewise; "" without
// one.
std::string describe_test_metric(const nlohmann::json& report);

// Steps that samples/s leaves out at the start of a run of `steps` steps (start-up, first
// allocations): a tenth of the run, between 1 and 10.
int64_t measurement_warmup(int64_t steps);

// A step's training loss as every output shows it (bar, step lines, the summary line): "%.6g",
// as test losses are. The report's final_loss holds the same value unrounded; the value itself
// is the mean loss over the step's whole global batch (train/trainer.cpp, docs/config.md's
// train.log_every).
std::string describe_loss(double loss);

// "12.3" below 100, "1234" from 100: the progress bar's numbers.
std::string human(double v);

// The progress bar as a sink: redraws at every step with the fields `format` makes of the
// latest gauges; prints notes on their own line below the bar. `log_every` > 0 also prints
// "step N loss L" every that many steps, when a "loss" gauge came for that step.
class ProgressSink : public core::EventSink {
 public:
  using Gauges = std::map<std::string, double>;
  using Format = std::function<std::string(const Gauges&, bool final)>;
  ProgressSink(std::string label, int64_t total, Format format, int64_t log_every = 0);
  void on_gauge(const std::string& name, double value, int64_t step) override;
  void on_step(int64_t done, int64_t total) override;
  void on_note(const std::string& text) override;
  // The final draw, with the fields `format(gauges, final = true)` makes.
  void finish();

 private:
  core::ProgressBar bar_;
  Format format_;
  int64_t log_every_;
  Gauges gauges_;
  int64_t loss_step_ = -1;  // the step of the latest "loss" gauge
};

// The training loop's fields: "loss <L> | <rate> samples/s", L the latest "loss" gauge as
// describe_loss() writes it (no loss field before the first one; samples/s "not measured" in
// the final draw when it is 0); "W <workers> g<generation> | " first once an elastic run's
// membership changed (gauges "workers" and "generation", generation > 0).
ProgressSink::Format loss_and_rate_fields();

// What the report keeps of the events: evaluations ("test_accuracy" or "test_loss" gauges, at
// the seconds of the last "train_seconds" gauge) and counters' totals.
class ReportSink : public core::EventSink {
 public:
  void on_counter(const std::string& name, double delta) override { totals_[name] += delta; }
  void on_gauge(const std::string& name, double value, int64_t step) override;
  const nlohmann::json& evals() const { return evals_; }
  double total(const std::string& name) const;

 private:
  nlohmann::json evals_ = nlohmann::json::array();
  double train_seconds_ = 0;
  std::map<std::string, double> totals_;
};

}  // namespace krab::train
