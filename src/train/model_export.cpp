#include "train/model_export.h"

#include <torch/torch.h>

#include <filesystem>

#include "core/errors.h"
#include "core/fs.h"
#include "core/seal.h"
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

// The model signature the checkpoint's small file states, before its seal is checked: a seal
// binds the run directory and the signature, so the job is named by what the file says and the
// seal then proves it (a forged signature fails the seal like any other change).
std::string stated_signature(const std::string& step_dir) {
  std::string path = manifest_path(step_dir);
  if (!core::path_exists(path)) path = (fs::path(step_dir) / "state.krab").string();
  std::string bytes = core::read_file(path);
  if (core::is_sealed(bytes)) bytes.resize(bytes.size() - 40);
  return read_meta(parse_checkpoint(bytes, path)).signature;
}

}  // namespace

std::string export_model_pt(const ExportOptions& o) {
  const std::string step_dir = pick_step_dir(o);
  const std::string key = core::read_seal_key(o.key_file, o.run_dir);
  const std::string job = checkpoint_job(o.run_dir, key.empty() ? "" : stated_signature(step_dir));
  auto reader = StateReader::open(step_dir, key, job);
  for (const auto& p : reader->params()) reader->verify(p.name);
  const core::Record& rep = reader->replicated();
  const std::string out = o.out.empty() ? (fs::path(o.run_dir) / "model.pt").string() : o.out;
  // One parameter in memory at a time (train/model_file.h), as save_model_pt orders them.
  core::AtomicFileWriter file(out, core::FileAccess::kShared);
  TorchSaveWriter pt(file);
  for (const auto& p : reader->params()) {
    at::Tensor t = at::empty(p.shape, at::kFloat);
    reader->read(p.name, "value", 0, t.numel(), t.data_ptr<float>());
    pt.add(p.name, t);
  }
  for (const std::string& name : rep.names())
    if (name.rfind("buffer.", 0) == 0) pt.add(name.substr(7), rep.tensor(name));
  pt.finish();
  file.commit();
  return out;
}

}  // namespace krab::train
