#include "train/model_export.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "core/fs.h"
#include "core/seal.h"
#include "models/script_file.h"
#include "train/checkpoint.h"
#include "train/checkpoint_reader.h"
#include "train/manifest.h"
#include "train/model_file.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

std::string pick_step_dir(const ExportOptions& o) {
  KRAB_CHECK_ARG(fs::is_directory(o.run_dir), "export: run directory '", o.run_dir,
                 "' does not exist");
  if (o.step) {
    const std::string dir = (fs::path(o.run_dir) / step_dir_name(*o.step)).string();
    KRAB_CHECK_ARG(core::path_exists(manifest_path(dir)) ||
                       core::path_exists((fs::path(dir) / "state.krab").string()),
                   "--step ", *o.step, ": '", dir, "' holds no checkpoint");
    return dir;
  }
  const auto dir = latest_step_dir(o.run_dir);
  KRAB_CHECK_ARG(dir.has_value(), "export: run directory '", o.run_dir,
                 "' has no checkpoint (no 'latest')");
  return *dir;
}

// Fills the reloaded module's tensor `name` from the checkpoint: a parameter read in place
// (one parameter in memory), a buffer from the replicated record. The file passed its SHA-256,
// so a name or shape the checkpoint lacks means a checkpoint of another model.
void fill_from_checkpoint(StateReader& reader, const std::string& name, at::Tensor& t) {
  const auto& params = reader.params();
  const auto p = std::find_if(params.begin(), params.end(),
                              [&](const engine::ParamShape& s) { return s.name == name; });
  if (p != params.end()) {
    if (t.scalar_type() != at::kFloat || t.sizes() != c10::IntArrayRef(p->shape))
      throw CorruptData(str_cat(reader.source(), ": parameter '", name, "' is ",
                                c10::IntArrayRef(p->shape), ", the model file's ", t.sizes(), " ",
                                t.scalar_type()));
    at::Tensor dst = t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
    reader.read(name, "value", 0, dst.numel(), dst.data_ptr<float>());
    if (!dst.is_same(t)) t.copy_(dst);
    return;
  }
  const core::Record& rep = reader.replicated();
  const std::string key = "buffer." + name;
  if (!rep.has(key))
    throw CorruptData(
        str_cat(reader.source(), " has no parameter or buffer '", name, "' of the model file"));
  const at::Tensor& b = rep.tensor(key);
  if (b.sizes() != t.sizes() || b.scalar_type() != t.scalar_type())
    throw CorruptData(str_cat(rep.source(), ": '", key, "' is ", b.sizes(), " ", b.scalar_type(),
                              ", the model file's ", t.sizes(), " ", t.scalar_type()));
  t.copy_(b);
}

void write_model_pt(StateReader& reader, const std::string& out) {
  // One parameter in memory at a time (train/model_file.h), as save_model_pt orders them.
  const core::Record& rep = reader.replicated();
  core::AtomicFileWriter file(out, core::FileAccess::kShared);
  TorchSaveWriter pt(file);
  for (const auto& p : reader.params()) {
    at::Tensor t = at::empty(p.shape, at::kFloat);
    reader.read(p.name, "value", 0, t.numel(), t.data_ptr<float>());
    pt.add(p.name, t);
  }
  for (const std::string& name : rep.names())
    if (name.rfind("buffer.", 0) == 0) pt.add(name.substr(7), rep.tensor(name));
  pt.finish();
  file.commit();
}

}  // namespace

ExportResult export_model(const ExportOptions& o) {
  const std::string step_dir = pick_step_dir(o);
  const std::string key = core::read_seal_key(o.key_file, o.run_dir);
  const std::string job = checkpoint_job(o.run_dir, key.empty() ? "" : stated_signature(step_dir));

  auto reader = StateReader::open(step_dir, key, job);
  for (const auto& p : reader->params()) reader->verify(p.name);
  const CheckpointMeta& meta = reader->meta();
  const models::ScriptFile script{meta.model_file, meta.model_sha256};
  ExportResult r;
  r.model_pt = o.out.empty() ? (fs::path(o.run_dir) / "model.pt").string() : o.out;
  if (!script.path.empty()) {
    r.model_ts = fs::path(r.model_pt).replace_extension(".ts").string();
    const std::string change = models::script_file_change(script);
    KRAB_CHECK_ARG(change.empty(), "export: model.ts: the model file ", change, " (",
                   reader->source(),
                   " records it; model.ts needs the code the weights were "
                   "trained with)");
  } else if (meta.model_name == "torchscript") {
    r.warnings.push_back(str_cat(reader->source(),
                                 " does not record its model file (an older krab wrote it): "
                                 "model.ts not written; model.pt holds the weights"));
  }
  write_model_pt(*reader, r.model_pt);
  if (!r.model_ts.empty())
    models::save_script_with_weights(
        script, o.trust_code,
        [&](const std::string& name, at::Tensor& t) { fill_from_checkpoint(*reader, name, t); },
        r.model_ts, "pass --trust-code to load it anyway if you vouch for the file");
  return r;
}

}  // namespace krab::train
