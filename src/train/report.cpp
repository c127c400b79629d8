#include "train/report.h"

#include <cmath>
#include <cstdio>

#include "core/errors.h"

namespace krab::train {

nlohmann::json make_report(const RunOutcome& o, const nlohmann::json& engine_fields,
                           const nlohmann::json& config) {
  nlohmann::json report;
  report["workers"] = o.workers;
  report["global_batch"] = o.global_batch;
  report["steps"] = o.steps;
  report["start_step"] = o.start_step;
  report["epochs"] = o.epochs;
  set_samples_per_sec(report, o.samples_per_sec, o.measured_steps);
  report["wall_seconds"] = o.wall_seconds;
  report["final_loss"] = o.final_loss;
  nlohmann::json evals = o.evals;
  if (o.test_loss) {
    report["metric"] = "loss";
    report["test_loss"] = *o.test_loss;
    evals.push_back({{"step", o.steps}, {"seconds", o.train_seconds}, {"test_loss", *o.test_loss}});
  } else if (o.test_accuracy >= 0) {
    report["metric"] = "accuracy";
    report["test_accuracy"] = o.test_accuracy;
    evals.push_back(
        {{"step", o.steps}, {"seconds", o.train_seconds}, {"test_accuracy", o.test_accuracy}});
  }
  if (o.eval_examples > 0) report["eval_examples"] = o.eval_examples;
  report["train_seconds"] = o.train_seconds;
  report["evals"] = evals;
  report["bytes_sent"] = o.bytes_sent;
  report["bytes_sent_steps"] = o.bytes_sent_steps;
  report["bytes_sent_by_op"] = o.bytes_sent_by_op;
  report["gradient_bytes"] = o.gradient_bytes;
  report["sync_mode"] = o.sync_mode;
  if (!o.memory.is_null()) report["memory"] = o.memory;
  if (!o.bottleneck.is_null()) report["bottleneck"] = o.bottleneck;
  if (!o.gradient_noise_scale.is_null()) report["gradient_noise_scale"] = o.gradient_noise_scale;
  report["checkpoint"] = o.checkpoint;
  report["state"] = o.state;
  report["config"] = config;
  for (const auto& [key, value] : engine_fields.items()) report[key] = value;
  // ZeRO stage 3 names the modules it gathers whole (not split into units): memory reads them.
  if (!o.memory.is_null() && engine_fields.contains("zero") &&
      engine_fields["zero"].contains("gathered_whole"))
    report["memory"]["gathered_whole"] = engine_fields["zero"]["gathered_whole"];
  return report;
}

void set_samples_per_sec(nlohmann::json& report, double samples_per_sec, int64_t measured_steps) {
  // A run no longer than its warm-up has no measured step: 0 would read as "infinitely slow"
  // in a table, so the report says null and why.
  if (measured_steps > 0 && samples_per_sec > 0) {
    report["samples_per_sec"] = samples_per_sec;
  } else {
    report["samples_per_sec"] = nullptr;
    report["samples_per_sec_note"] =
        "not measured: the run ended within its warm-up steps, which samples_per_sec leaves "
        "out; run more steps to measure it";
  }
}

std::string describe_samples_per_sec(const nlohmann::json& report) {
  const auto it = report.find("samples_per_sec");
  if (it == report.end() || !it->is_number()) return "samples/s not measured";
  return str_cat(static_cast<int64_t>(std::llround(it->get<double>())), " samples/s");
}

std::string describe_test_metric(const std::string& metric, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), metric == "loss" ? "test loss %.6g" : "test accuracy %.4f",
                value);
  return text;
}

std::string describe_test_metric(const nlohmann::json& report) {
  const std::string metric = report.value("metric", "");
  const auto it = report.find("test_" + metric);
  if (metric.empty() || it == report.end() || !it->is_number()) return "";
  return describe_test_metric(metric, it->get<double>());
}

int64_t measurement_warmup(int64_t steps) {
  return std::min<int64_t>(10, std::max<int64_t>(1, steps / 10));
}

std::string human(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : "%.1f", v);
  return buf;
}

ProgressSink::ProgressSink(std::string label, int64_t total, Format format, int64_t log_every)
    : bar_(std::move(label), total), format_(std::move(format)), log_every_(log_every) {}

std::string describe_loss(double loss) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", loss);
  return text;
}

void ProgressSink::on_gauge(const std::string& name, double value, int64_t step) {
  gauges_[name] = value;
  if (name == "loss") loss_step_ = step;
}

void ProgressSink::on_step(int64_t done, int64_t total) {
  bar_.update(done, format_(gauges_, false));
  if (log_every_ > 0 && done % log_every_ == 0 && loss_step_ == done)
    std::fprintf(stderr, "\nkrab: step %lld loss %s\n", static_cast<long long>(done),
                 describe_loss(gauges_["loss"]).c_str());
}

void ProgressSink::on_note(const std::string& text) {
  std::fprintf(stderr, "\nkrab: %s\n", text.c_str());
}

void ProgressSink::finish() { bar_.finish(format_(gauges_, true)); }

ProgressSink::Format loss_and_rate_fields() {
  return [](const ProgressSink::Gauges& g, bool final) {
    const auto get = [&g](const char* name) {
      const auto it = g.find(name);
      return it == g.end() ? 0.0 : it->second;
    };
    const double rate = get("samples_per_sec");
    const auto loss = g.find("loss");
    // An elastic run after its first change: the workers now and the generation.
    const double generation = get("generation");
    return str_cat(
        generation > 0 ? str_cat("W ", static_cast<int64_t>(get("workers")), " g",
                                 static_cast<int64_t>(generation), " | ")
                       : std::string(),
        loss == g.end() ? std::string() : "loss " + describe_loss(loss->second) + " | ",
        final && rate <= 0 ? std::string("samples/s not measured") : human(rate) + " samples/s");
  };
}

void ReportSink::on_gauge(const std::string& name, double value, int64_t step) {
  if (name == "train_seconds") train_seconds_ = value;
  if (name == "test_accuracy" || name == "test_loss")
    evals_.push_back({{"step", step}, {"seconds", train_seconds_}, {name, value}});
}

double ReportSink::total(const std::string& name) const {
  const auto it = totals_.find(name);
  return it == totals_.end() ? 0 : it->second;
}

}  // namespace krab::train
