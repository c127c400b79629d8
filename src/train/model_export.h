// `krab export RUN_DIR [--step N]`: model.pt from any checkpoint of a run, state.krab or
// sharded (docs/design/zero-sharding.md §4.4), through StateReader (train/checkpoint_reader.h):
// every parameter by name, whatever world size and stage wrote it, plus the buffers.
//
// The file is what save_model_pt() writes at the end of a run: a name -> tensor dict for
// torch.load / torch::pickle_load, parameters in signature order then buffers. It is streamed
// through TorchSaveWriter (train/model_file.h), one parameter in memory at a time (plus the
// shard records the reader holds); never the optimizer state.
//
// For a TorchScript run (the checkpoint records its model file: CheckpointMeta::model_file) it
// also writes model.ts beside model.pt (same name, extension .ts) by the end-of-run path
// (models/script_file.h): the run's own file, checked against its recorded SHA-256, loaded
// again (inspected unless trust_code), each parameter read from the checkpoint straight into
// the reloaded module's tensor. Never the optimizer state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace krab::train {

struct ExportOptions {
  std::string run_dir;
  std::optional<int64_t> step;  // --step: that step's directory; else `latest`'s
  std::string out;              // "" = RUN_DIR/model.pt
  std::string key_file;         // the run's checkpoint.hmac_key_file for a sealed run; ""
  bool trust_code = false;      // --trust-code: load the model file without inspecting it
};

struct ExportResult {
  std::string model_pt;
  std::string model_ts;               // "" when the run's model is not TorchScript
  std::vector<std::string> warnings;  // one line each, for "krab: warning: ..."
};

// Writes model.pt (and model.ts); returns their paths. Everything is checked before anything
// is written: InvalidArgument naming RUN_DIR or --step when there is no such checkpoint, and
// naming the model file when it is missing or its SHA-256 is not the recorded one (or the
// inspection refuses it); CorruptData naming the file for a missing, damaged or foreign
// manifest, shard or state.krab (core/seal.h's rules for a sealed run: the seal is checked
// against the run directory and the model signature the file states). A TorchScript checkpoint
// that records no model file (an older krab's) gives model.pt and a warning.
ExportResult export_model(const ExportOptions& options);

}  // namespace krab::train
