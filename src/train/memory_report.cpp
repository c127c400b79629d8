#include "train/memory_report.h"

#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

#include "train/memory_plan.h"

namespace krab::train {
namespace {

// Columns of the gathered table.
enum Column { kKnown, kParams, kGrads, kOptimizer, kWorkingSet, kOffloaded, kPeakRss, kColumns };

// `total` is the model's part (resident()); `peak` adds the process and the data, as the
// launcher's check does: the number to hold against the measured peak_rss_bytes.
nlohmann::json predicted_json(const parallel::zero::MemoryPrediction& p, int64_t data_bytes) {
  return {{"params", p.params},
          {"grads", p.grads},
          {"optimizer", p.optimizer},
          {"working_set", p.working_set},
          {"comm_buffers", p.comm_buffers},
          {"low_precision", p.low_precision},
          {"compression", p.compression},
          {"activations", p.activations},
          {"evaluation", p.evaluation},
          {"heap", p.heap},
          {"offloaded", p.offloaded},
          {"total", p.resident()},
          {"process", parallel::zero::kWorkerProcessBytes},
          {"data", parallel::zero::kDataCopies * data_bytes},
          {"peak", parallel::zero::worker_peak_bytes(p, data_bytes)}};
}

}  // namespace

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

at::Tensor gather_rank_memory(const engine::Engine& engine, comm::Communicator& group) {
  // Each rank fills its own row of zeros; a sum all-reduce then gives every rank the table,
  // with the same collective the loop's totals use.
  at::Tensor table = torch::zeros({group.size(), kColumns}, torch::kFloat64);
  const engine::MemoryStats m = engine.memory();
  at::Tensor row = table[group.rank()];
  row[kKnown] = m.known ? 1.0 : 0.0;
  row[kParams] = static_cast<double>(m.params);
  row[kGrads] = static_cast<double>(m.grads);
  row[kOptimizer] = static_cast<double>(m.optimizer);
  row[kWorkingSet] = static_cast<double>(m.working_set_peak);
  row[kOffloaded] = static_cast<double>(m.offloaded);
  row[kPeakRss] = static_cast<double>(peak_rss_bytes());
  group.allreduce(table)->wait();
  return table;
}

nlohmann::json memory_report(const core::Config& config, models::Model& model,
                             const at::Tensor& table, int64_t activation_bytes,
                             int64_t evaluation_bytes, int64_t data_bytes) {
  std::vector<engine::ParamShape> params;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) params.push_back({item.key(), item.value().sizes().vec()});
  const int world = static_cast<int>(table.size(0));
  parallel::zero::MemoryInputs in = memory_inputs(config, world, params, model.unit_candidates());
  in.activation_bytes = activation_bytes;
  in.evaluation_activation_bytes = evaluation_bytes;
  const nlohmann::json predicted = predicted_json(parallel::zero::predict_memory(in), data_bytes);
  auto bytes = [](const at::Tensor& row, Column c, bool known) -> nlohmann::json {
    if (!known) return nullptr;
    return static_cast<int64_t>(row[c].item<double>());
  };
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    const at::Tensor row = table[r];
    const bool known = row[kKnown].item<double>() > 0;
    ranks.push_back({{"rank", r},
                     {"peak_rss_bytes", static_cast<int64_t>(row[kPeakRss].item<double>())},
                     {"params_bytes", bytes(row, kParams, known)},
                     {"grads_bytes", bytes(row, kGrads, known)},
                     {"optimizer_bytes", bytes(row, kOptimizer, known)},
                     {"working_set_peak_bytes", bytes(row, kWorkingSet, known)},
                     {"offloaded_bytes", bytes(row, kOffloaded, known)},
                     {"predicted", predicted}});
  }
  return {{"stage", in.stage},
          {"precision", in.precision == parallel::zero::Precision::kBf16 ? "bf16" : "fp32"},
          {"activation_checkpointing", in.activation_checkpointing},
          {"ranks", ranks}};
}

}  // namespace krab::train
