#include "train/memory_plan.h"

#include <cstdio>
#include <fstream>

#include "core/archive_walk.h"
#include "core/errors.h"
#include "models/describe.h"
#include "parallel/zero/plan.h"
#include "train/job.h"
#include "train/options.h"

namespace krab::train {
namespace {

namespace zero = parallel::zero;

zero::OptimizerKind optimizer_kind(const core::Config& c) {
  const std::string& name = c.get_string("train.optimizer.name");
  if (name == "adam") return zero::OptimizerKind::kAdam;
  if (name == "adamw") return zero::OptimizerKind::kAdamW;
  return c.get_float("train.optimizer.momentum") > 0 ? zero::OptimizerKind::kSgdMomentum
                                                     : zero::OptimizerKind::kSgd;
}

std::string billions(int64_t n) {
  char buf[64];
  if (n >= 1000000000)
    std::snprintf(buf, sizeof(buf), "%.1f B", n / 1e9);
  else if (n >= 1000000)
    std::snprintf(buf, sizeof(buf), "%.1f M", n / 1e6);
  else
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  return buf;
}

// As models/script_inspection.cpp: torch.jit.save deflates its source and debug records, a few
// MB for a large network; only the sizes are read here.
constexpr uint64_t kMaxInflated = uint64_t{64} << 20;

}  // namespace

// torch::jit::load would build the module; the zip directory alone says the records' sizes.

int64_t archive_values(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KRAB_CHECK_ARG(in.good(), "model.path: cannot read '", path, "'");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t bytes = 0;
  for (const auto& [name, n] :
       core::check_zip_directory(in, size, path, "TorchScript archive", kMaxInflated))
    if (name.rfind("data/", 0) == 0) bytes += n;
  return static_cast<int64_t>(bytes / 4);
}

int64_t int_key_or(const core::Config& c, const std::string& key, int64_t fallback) {
  return core::find_key(key) != nullptr ? c.get_int(key) : fallback;
}

bool bool_key_or(const core::Config& c, const std::string& key, bool fallback) {
  return core::find_key(key) != nullptr ? c.get_bool(key) : fallback;
}

std::string string_key_or(const core::Config& c, const std::string& key,
                          const std::string& fallback) {
  return core::find_key(key) != nullptr ? c.get_string(key) : fallback;
}

int64_t evaluation_activation_bytes(const models::ModelSpec& spec, int64_t test_size, int world) {
  // Each rank evaluates its contiguous share (train/evaluation.h): the largest is the ceiling.
  const int64_t share = (test_size + world - 1) / std::max(world, 1);
  return models::evaluation_activation_bytes(spec, std::min(share, kEvaluationBatch));
}

zero::MemoryInputs memory_inputs(const core::Config& c, int world,
                                 const std::vector<engine::ParamShape>& params,
                                 const std::vector<std::string>& candidates) {
  zero::MemoryInputs in;
  in.world_size = world;
  in.stage = static_cast<int>(int_key_or(c, "parallel.zero_stage", 0));
  const std::string& compression = c.get_string("comm.compression");
  const int64_t chunk = c.get_int("comm.chunk") > 0 ? c.get_int("comm.chunk") : 256;
  in.alignment =
      zero::shard_alignment(compression == "int8" || compression == "onebit" ? chunk : 1);
  // Units matter from stage 1 on (padding, stage 3's gathers); stage 0 ignores them. They are
  // planned at every stage all the same, so that the launcher can evaluate a higher stage from
  // the same inputs.
  // The engine's own rule (plan_wrap): the same units as the run will have.
  const std::string wrap = string_key_or(c, "parallel.wrap", "auto");
  in.unit_numel.clear();
  for (const engine::UnitParams& unit : zero::plan_wrap(params, candidates, wrap)) {
    int64_t n = 0;
    for (const engine::ParamShape& p : unit.params) {
      int64_t numel = 1;
      for (int64_t d : p.shape) numel *= d;
      n += numel;
    }
    in.unit_numel.push_back(n);
  }
  in.optimizer = optimizer_kind(c);
  in.precision = string_key_or(c, "train.precision", "fp32") == "bf16" ? zero::Precision::kBf16
                                                                       : zero::Precision::kFp32;
  in.offload = string_key_or(c, "parallel.offload", "none") == "disk" ? zero::Offload::kDisk
                                                                      : zero::Offload::kNone;
  in.activation_checkpointing = bool_key_or(c, "model.activation_checkpointing", false);
  in.prefetch = static_cast<int>(int_key_or(c, "parallel.prefetch", 1));
  // An elastic ZeRO run keeps each rank's ward shard too (parallel/zero/buddy.h).
  in.replicate_shards = in.stage > 0 && in.offload == zero::Offload::kNone &&
                        bool_key_or(c, "elastic.enabled", false) &&
                        bool_key_or(c, "elastic.replicate_shards", true);
  // bucket_mb 0 gives every gradient a bucket of its own: at most one unit, which
  // predict_memory's max(cap, unit) already covers.
  in.bucket_bytes =
      std::max<int64_t>(1, static_cast<int64_t>(c.get_float("parallel.bucket_mb") * (1 << 20)));
  in.error_feedback = compression != "none" && c.get_bool("comm.error_feedback");
  in.micro_batches = static_cast<int>(c.get_int("train.grad_accum"));
  return in;
}

MemoryPlan plan_memory(const core::Config& job, int world) {
  return plan_memory(job, load_data(job, DataResidency::kLazy, LoadNotes::kQuiet), world);
}

MemoryPlan plan_memory(const core::Config& job, const data::DataSplits& d, int world) {
  const core::Config c = with_folded_momentum(job);  // randomk may fold sgd's momentum away
  const models::ModelSpec spec = model_spec(c, d);
  MemoryPlan plan;
  plan.data_bytes =
      d.training().resident_bytes() + (d.testing() ? d.testing()->resident_bytes() : 0);
  std::vector<engine::ParamShape> params;
  std::vector<std::string> candidates;
  int64_t count = 0;
  if (spec.name == "torchscript") {
    // Not split before the model is loaded: all in the root unit (a prediction for stage 3
    // that treats it as gathered whole, the safe side).
    // A file that cannot be walked is preflight's to refuse, with its own message (the model
    // checks come after this one); until then it counts as no parameters.
    try {
      count = archive_values(spec.path);
    } catch (const std::exception&) {
      count = 0;
    }
    params.push_back({"archive", {count}});
    plan.activations_predicted = false;
  } else {
    const models::ParameterTable table = models::describe_parameters(spec);
    for (const models::ParameterShape& p : table.params)
      if (p.trainable) params.push_back({p.name, p.shape});
    candidates = table.unit_candidates;
    count = table.numel();
    // An adaptive batch's largest step is one forward of max / world examples per worker.
    const int64_t adaptive_max = int_key_or(c, "train.adaptive_batch.max", 0);
    const int64_t batch = adaptive_max > 0 ? std::max<int64_t>(c.get_int("data.batch_size"),
                                                               adaptive_max / std::max(world, 1))
                                           : c.get_int("data.batch_size");
    plan.activations_plain = models::activation_bytes(spec, batch, false);
    plan.activations_checkpointed = models::activation_bytes(spec, batch, true);
  }
  plan.model = str_cat("a ", spec.name, " of ", billions(count), " parameters");
  plan.inputs = memory_inputs(c, world, params, candidates);
  if (spec.name != "torchscript")
    plan.inputs.evaluation_activation_bytes = evaluation_activation_bytes(
        spec,
        d.testing() ? evaluation_size(d.testing()->size(), c.get_int("train.eval_examples")) : 0,
        world);
  plan.inputs.activation_bytes =
      plan.inputs.activation_checkpointing && plan.activations_checkpointed >= 0
          ? plan.activations_checkpointed
          : plan.activations_plain;
  return plan;
}

}  // namespace krab::train
