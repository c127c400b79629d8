#include "train/bottleneck.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/errors.h"
#include "train/step_phases.h"

namespace krab::train {
namespace {

// The overheads a config key can address, in the report's order.
constexpr const char* kOverheads[] = {"communication", "waiting", "data", "optimizer"};
// Below this share of the step every overhead is noise: the run is compute-bound.
constexpr double kComputeBound = 0.10;

}  // namespace

int phase_index(const std::string& name) {
  static const std::pair<const char*, int> kPhases[] = {
      {phase::kData, PhaseTotals::kData},
      {phase::kForward, PhaseTotals::kForward},
      {phase::kBackward, PhaseTotals::kBackward},
      {phase::kReduce, PhaseTotals::kReduce},
      {phase::kOptimizer, PhaseTotals::kOptimizer},
      {phase::kAfter, PhaseTotals::kAfter},
      {phase::kEnd, PhaseTotals::kEnd},
      {phase::kLoss, PhaseTotals::kLoss},
      {phase::kStep, PhaseTotals::kStep}};
  for (const auto& [n, p] : kPhases)
    if (name == n) return p;
  return -1;
}

namespace {

std::string percent(double f) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100 * f);
  return buf;
}

// `slow`: the slowest rank's row of fractions.
nlohmann::json suggestion(const std::string& largest, const RunShape& shape, int slowest,
                          const nlohmann::json& slow) {
  auto make = [](std::string key, std::string value, std::string why) {
    return nlohmann::json{
        {"key", std::move(key)}, {"value", std::move(value)}, {"why", std::move(why)}};
  };
  // The others wait for a rank slowed by its data: more decoding helps every rank, where a
  // smaller slice would only move the wait.
  if (largest == "waiting" && slow["data"].get<double>() > slow["compute"].get<double>())
    return suggestion("data", shape, slowest, slow);
  if (largest == "waiting") {
    if (shape.balance != "auto")
      return make("parallel.balance", "auto",
                  str_cat("rank ", slowest,
                          " is the slowest and the others wait for it at every step; auto "
                          "gives each rank a slice of the batch sized by its speed"));
    return make("elastic.enabled", "true",
                str_cat("rank ", slowest,
                        " stays the slowest with parallel.balance auto; an elastic run can "
                        "drop its machine or add a faster one"));
  }
  if (largest == "communication") {
    if (shape.compression == "none")
      return make("comm.compression", "powersgd",
                  "the gradients' all-reduce is not hidden by backward; powersgd (rank "
                  "comm.rank) sends a few percent of the bytes");
    if (shape.sync_mode == "sync")
      return make("sync.mode", "local_sgd",
                  str_cat("communication stays exposed with comm.compression ", shape.compression,
                          "; local_sgd averages every sync.period steps"));
    return make("parallel.bucket_mb", "100",
                "fewer, larger buckets pay the per-message latency less often");
  }
  if (largest == "data") {
    if (shape.decodes_images)
      return make("data.decode_threads", std::to_string(std::max(2, 2 * shape.decode_threads)),
                  "the ranks wait for decoded images; more threads decode ahead");
    return make("data.path", "(a local disk)",
                "the ranks wait for their batches; read the data from a faster place");
  }
  if (largest == "optimizer") {
    if (shape.zero_stage == 0 && shape.workers > 1)
      return make("parallel.zero_stage", "1",
                  "every rank updates the whole model; stage 1 splits the update among the "
                  "ranks");
    return make("train.optimizer.name", "sgd",
                "the update itself is the largest overhead; a lighter optimizer costs less");
  }
  return make("parallel.workers", str_cat(shape.workers * 2),
              "the step is compute-bound: communication, waiting, data and the update are each "
              "under a tenth of it; more workers (or train.precision bf16) go faster");
}

}  // namespace

void PhaseSink::on_span(const std::string& name, std::chrono::steady_clock::time_point,
                        double seconds) {
  const int p = phase_index(name);
  if (p < 0) return;
  totals_.seconds[p] += seconds;
  if (p == PhaseTotals::kStep) ++totals_.steps;
}

nlohmann::json bottleneck_report(const std::vector<PhaseTotals>& ranks, const RunShape& shape) {
  using P = PhaseTotals;
  // Per step, per rank: communication (reduce + after) and the busy time.
  std::vector<double> step(ranks.size()), comm(ranks.size()), busy(ranks.size());
  double least_comm = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const P& t = ranks[r];
    if (t.steps == 0 || t.seconds[P::kStep] <= 0) continue;
    const double n = static_cast<double>(t.steps);
    step[r] = t.seconds[P::kStep] / n;
    comm[r] = (t.seconds[P::kReduce] + t.seconds[P::kAfter] + t.seconds[P::kLoss]) / n;
    busy[r] = (t.seconds[P::kData] + t.seconds[P::kForward] + t.seconds[P::kBackward] +
               t.seconds[P::kOptimizer]) /
              n;
    least_comm = least_comm < 0 ? comm[r] : std::min(least_comm, comm[r]);
  }
  if (least_comm < 0) return nullptr;
  nlohmann::json rows = nlohmann::json::array();
  std::map<std::string, double> mean;
  int slowest = -1, timed = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (step[r] <= 0) continue;
    const P& t = ranks[r];
    const double n = static_cast<double>(t.steps), s = step[r];
    nlohmann::json row{{"rank", r}, {"step_seconds", s}};
    row["compute"] = (t.seconds[P::kForward] + t.seconds[P::kBackward]) / n / s;
    row["communication"] = least_comm / s;
    row["waiting"] = (comm[r] - least_comm) / s;
    row["data"] = t.seconds[P::kData] / n / s;
    row["optimizer"] = t.seconds[P::kOptimizer] / n / s;
    double rest = 1;
    for (const char* k : {"compute", "communication", "waiting", "data", "optimizer"})
      rest -= row[k].get<double>();
    row["other"] = std::max(0.0, rest);
    for (const char* k : kOverheads) mean[k] += row[k].get<double>();
    if (slowest < 0 || busy[r] > busy[static_cast<size_t>(slowest)]) slowest = static_cast<int>(r);
    ++timed;
    rows.push_back(std::move(row));
  }
  std::string largest = "compute";
  double most = kComputeBound;
  for (const char* k : kOverheads)
    if (mean[k] / timed > most) {
      most = mean[k] / timed;
      largest = k;
    }
  nlohmann::json slow;
  for (const auto& row : rows)
    if (row["rank"].get<int>() == slowest) slow = row;
  return {{"ranks", std::move(rows)},
          {"slowest_rank", slowest},
          {"largest", largest},
          {"suggestion", suggestion(largest, shape, slowest, slow)}};
}

std::vector<std::string> describe_bottleneck(const nlohmann::json& b) {
  if (b.is_null()) return {};
  std::map<std::string, double> mean;
  const auto& rows = b["ranks"];
  for (const auto& row : rows)
    for (const char* k : {"compute", "communication", "waiting", "data", "optimizer", "other"})
      mean[k] += row[k].get<double>() / static_cast<double>(rows.size());
  std::string shares = "step time:";
  for (const char* k : {"compute", "communication", "waiting", "data", "optimizer", "other"})
    shares += str_cat(" ", k, " ", percent(mean[k]), k == std::string("other") ? "" : ",");
  shares += str_cat(" (mean of ", rows.size(), rows.size() == 1 ? " rank)" : " ranks)");
  const int slowest = b["slowest_rank"].get<int>();
  double slow_step = 0;
  for (const auto& row : rows)
    if (row["rank"].get<int>() == slowest) slow_step = row["step_seconds"].get<double>();
  const auto& s = b["suggestion"];
  std::vector<std::string> lines{shares};
  if (rows.size() > 1)
    lines.push_back(str_cat("slowest rank: ", slowest, " (",
                            static_cast<int64_t>(slow_step * 1000 + 0.5), " ms per step)"));
  lines.push_back(str_cat("largest: ", b["largest"].get<std::string>(), "; try ",
                          s["key"].get<std::string>(), ": ", s["value"].get<std::string>(), " (",
                          s["why"].get<std::string>(), ")"));
  return lines;
}

}  // namespace krab::train
