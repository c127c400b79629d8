// model.ts: a TorchScript run's trained module, written from the user's own file
// (docs/design/zero-sharding.md §4.4). One path for the end of a run (TorchScriptModel::save)
// and for `krab export` (train/model_export.h), so both give the same file for the same
// weights.
//
// The module that trains is never saved: krab rewrote copies of its methods to call its own
// operator (models/script_units.h), which Python's torch.jit.load cannot resolve. Instead the
// file the run loaded is loaded again — inspected as at the start (models/script_inspection.h)
// unless the caller vouches for it — every parameter and buffer is filled in by name, the
// module is put in eval mode and saved, streamed to the output through core::AtomicFileWriter.
// So no krab operator ever reaches a file Python loads, and the weights can come from anywhere:
// the live model, or a checkpoint read one parameter at a time.
//
// The file must be the one the run trained: its SHA-256 is taken when the run loads it
// (ScriptFile), recorded in every checkpoint (train/checkpoint.h, meta.model_*), and checked
// before it is loaded again; a file changed since is refused by name, never filled with weights
// its code was not trained with.
//
// Memory: the reloaded module (the model's bytes once more) and one tensor being filled; the
// file is written as it is serialised, never held. Thread safety: none needed (one caller).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

namespace krab::models {

// A TorchScript file as a run loaded it.
struct ScriptFile {
  std::string path;    // absolute
  std::string sha256;  // 64 lowercase hex digits, of the bytes when the run loaded them
};

// `path` made absolute, and the SHA-256 of its bytes now (read in chunks of 1 MiB).
// InvalidArgument naming the file when it cannot be read.
ScriptFile script_file_of(const std::string& path);

// "" when the file at file.path still has file.sha256; else why not, one line naming the file
// ("'/x/net.ts' is missing", "'/x/net.ts' changed since the run loaded it: SHA-256 ... instead
// of ...").
std::string script_file_change(const ScriptFile& file);

// Gives the value of parameter or buffer `name` (the scripted module's full name,
// "body.fc.weight") by writing it into `tensor`, the reloaded module's own tensor of that
// name (CPU, its shape and dtype, contiguous). Throws to stop the save (nothing written).
using WeightFill = std::function<void(const std::string& name, at::Tensor& tensor)>;

// Writes `out` (0644, atomically) as above. InvalidArgument naming the file when it is
// missing or changed (script_file_change), or when the inspection refuses it (`advice` is
// appended to that message); what `fill` throws; krab::Error naming `out` for a write failure.
void save_script_with_weights(const ScriptFile& file, bool trust_code, const WeightFill& fill,
                              const std::string& out, const std::string& advice = "");

}  // namespace krab::models
