#include "train/preflight.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/errors.h"
#include "core/fs.h"
#include "core/seal.h"
#include "models/describe.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/checkpoint_reader.h"
#include "train/dry_run.h"
#include "train/engines.h"
#include "train/job.h"
#include "train/manifest.h"
#include "train/memory_plan.h"
#include "train/optimizer_state.h"
#include "train/options.h"
#include "train/sharded_checkpoint.h"
#include "train/trainer.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

// The model's trainable parameters as the workers will have them, from its description.
struct ModelShape {
  std::vector<engine::ParamShape> trainable;  // named_parameters order
  std::vector<std::string> unit_candidates;   // what parallel.wrap: auto takes
  int64_t numel = 0;
  bool shapes_known = true;  // false for a TorchScript file: one row of its stored values
};

ModelShape describe_model(const models::ModelSpec& spec) {
  ModelShape shape;
  if (spec.name == "torchscript") {
    // A file that cannot be walked counts as small: loading it then says what is wrong with it,
    // in the words the workers would use.
    try {
      shape.numel = archive_values(spec.path);
    } catch (const std::exception&) {
      shape.numel = 0;
    }
    shape.trainable.push_back({"archive", {shape.numel}});
    shape.shapes_known = false;
    return shape;
  }
  const models::ParameterTable table = models::describe_parameters(spec);
  shape.unit_candidates = table.unit_candidates;
  for (const models::ParameterShape& p : table.params) {
    if (!p.trainable) continue;
    shape.trainable.push_back({p.name, p.shape});
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    shape.numel += n;
  }
  return shape;
}

std::vector<engine::ParamShape> trainable_shapes(models::Model& model) {
  std::vector<engine::ParamShape> out;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) out.push_back({item.key(), item.value().sizes().vec()});
  return out;
}

// model_signature()'s text for the described parameters (every built-in one is trainable).
std::string signature_of(const ModelShape& shape) {
  std::ostringstream os;
  for (const engine::ParamShape& p : shape.trainable)
    os << p.name << ":" << at::IntArrayRef(p.shape) << ";";
  return os.str();
}

std::string millions(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), n >= 1000000000 ? "%.1f B" : "%.1f M",
                n >= 1000000000 ? n / 1e9 : n / 1e6);
  return buf;
}

// The one line that says what the launcher left to the workers for a model above the limit.
void say_not_built(const models::ModelSpec& spec, int64_t numel,
                   const std::optional<models::ModelSpec>& reduced, bool resuming) {
  std::string tried;
  if (reduced && spec.name == "gpt")
    tried = str_cat("it tried the data on a gpt of ", reduced->layers, " block of width ",
                    reduced->width, " (same vocabulary, context and heads)");
  else if (reduced)
    tried = str_cat("it tried the data on an mlp of hidden width ", reduced->hidden);
  else
    tried = "the workers try the data on it";
  const std::string what =
      spec.name == "torchscript"
          ? str_cat("model.path '", spec.path, "' (", millions(numel), " stored values)")
          : str_cat("a ", spec.name, " of ", millions(numel), " parameters");
  std::fprintf(stderr, "krab: the launcher does not build %s, more than %s: %s%s\n", what.c_str(),
               millions(kWholeModelLimit).c_str(), tried.c_str(),
               resuming ? "; the workers verify the checkpoint's files" : "");
}

// The model the workers make, tried on the first examples (train/dry_run.h); the metric
// resolved against it.
void try_on_data(const core::Config& c, const data::DataSplits& d, models::Model& model,
                 bool whole) {
  if (whole) print_model_warnings(model);  // here, once: the workers make the model again
  resolve_metric(c, model, d);             // refuses train.metric accuracy without classes
  // After the label checks (their messages say more than LibTorch's loss would).
  dry_run(model, d, c);
}

// Every byte of the checkpoint decoded into `model` and a fresh optimizer, as a worker would.
void check_resume_whole(const core::Config& c, models::Model& model, const std::string& seal_key,
                        const std::string& step_dir, int64_t global_batch) {
  auto opt = make_optimizer(c, model.parameters());
  CheckpointMeta expect{0, c.get_string("model.name"), model_signature(model), global_batch,
                        c.get_int("train.seed")};
  const std::string job_id = checkpoint_job(run_directory(c), expect.signature);
  const std::string path = (fs::path(step_dir) / "state.krab").string();
  // A sharded checkpoint is read as a stage-0 resume reads it: every shard, verified.
  if (core::path_exists(manifest_path(step_dir)))
    restore_checkpoint(nullptr, step_dir, {seal_key, job_id}, expect, {&model, opt.get()});
  else
    decode_checkpoint(read_checkpoint_file(path, seal_key, job_id), path, expect, model, *opt);
}

// Without a model: a sharded checkpoint's manifest (small) read, unsealed and checked against
// the job (model name and parameter shapes, global batch) and its optimizer. The shards, and a
// state.krab (the whole state in one file), are left to the workers.
void check_resume_manifest(const core::Config& c, const ModelShape& shape,
                           const std::string& seal_key, const std::string& step_dir,
                           int64_t global_batch) {
  if (!shape.shapes_known || !core::path_exists(manifest_path(step_dir))) return;
  CheckpointMeta expect{0, c.get_string("model.name"), signature_of(shape), global_batch,
                        c.get_int("train.seed")};
  const auto reader =
      StateReader::open(step_dir, seal_key, checkpoint_job(run_directory(c), expect.signature));
  check_resumable(reader->meta(), expect, reader->source());
  const std::string mine = optimizer_type(*make_optimizer(c, {torch::zeros({1})}));
  KRAB_CHECK_ARG(reader->optimizer_type() == mine, reader->source(),
                 " holds the state of optimizer '", reader->optimizer_type(),
                 "'; this job's train.optimizer.name is '", mine, "'");
}

void check_job_keys(const core::Config& job, const core::Config& c, int workers) {
  KRAB_CHECK_ARG(workers >= 1, "parallel.workers must be >= 1, got ", workers);
  check_compression_options(job);  // the job as written: its keys are what errors name
  check_async_options(c);
  check_zero_options(job);
}

}  // namespace

PreflightInfo preflight(const core::Config& job, int workers,
                        const std::function<void(const data::DataSplits&)>& before_model) {
  const core::Config c = with_folded_momentum(job);
  check_job_keys(job, c, workers);
  // The synchronous trainer reads shards lazily; the parameter-server mode holds all the data.
  // Quiet: rank 0's worker says what data.skip_bad skipped (job.h).
  auto d = load_data(
      c, c.get_string("sync.mode") == "async" ? DataResidency::kInMemory : DataResidency::kLazy,
      LoadNotes::kQuiet);
  const int64_t global = workers * c.get_int("data.batch_size");
  KRAB_CHECK_ARG(global <= d.training().size(), "data.batch_size ", c.get_int("data.batch_size"),
                 " x ", workers, " workers = global batch ", global,
                 " is larger than the training data (", d.training().size(), " examples)");
  if (before_model) before_model(d);
  const models::ModelSpec spec = model_spec(c, d);
  const ModelShape shape = describe_model(spec);  // refuses a spec make_model would refuse
  const bool whole = shape.numel <= kWholeModelLimit;
  const auto reduced = whole ? std::nullopt : models::reduced_spec(spec);
  if (!whole) say_not_built(spec, shape.numel, reduced, c.get_bool("checkpoint.resume"));
  std::shared_ptr<models::Model> model;
  if (whole || reduced) model = models::make_model(whole ? spec : *reduced);
  if (model) try_on_data(c, d, *model, whole);
  const bool described = shape.shapes_known || !model;
  check_offload_room(c, described ? shape.trainable : trainable_shapes(*model),
                     described ? shape.unit_candidates : model->unit_candidates(),
                     workers);  // the job as the workers run it
  // A bad key file is bad input: refuse it now, not at the first checkpoint.
  const std::string seal_key =
      core::read_seal_key(c.get_string("checkpoint.hmac_key_file"), run_directory(c));
  const int64_t global_batch = global * c.get_int("train.grad_accum");
  if (c.get_bool("checkpoint.resume"))
    if (auto step_dir = latest_step_dir(run_directory(c))) {
      if (whole)
        check_resume_whole(c, *model, seal_key, *step_dir, global_batch);
      else
        check_resume_manifest(c, shape, seal_key, *step_dir, global_batch);
    }
  PreflightInfo info;
  info.parameters = whole ? models::parameter_count(*model) : shape.numel;
  // A lazily read training split counts what it may hold in memory, not its size on disk.
  info.data_bytes =
      d.training().resident_bytes() + (d.testing() ? d.testing()->resident_bytes() : 0);
  return info;
}

}  // namespace krab::train
