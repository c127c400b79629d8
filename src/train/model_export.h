// `krab export RUN_DIR [--step N]`: model.pt from any checkpoint of a run, state.krab or
// sharded (docs/design/zero-sharding.md §4.4), through StateReader (train/checkpoint_reader.h):
// every parameter by name, whatever world size and stage wrote it, plus the buffers.
//
// The file is what save_model_pt() writes at the end of a run: a name -> tensor dict for
// torch.load / torch::pickle_load, parameters in signature order then buffers. It is streamed
// through TorchSaveWriter (train/model_file.h), one parameter in memory at a time (plus the
// shard records the reader holds); never the optimizer state.
// model.ts (TorchScript runs) is not written by export yet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace krab::train {

struct ExportOptions {
  std::string run_dir;
  std::optional<int64_t> step;  // --step: that step's directory; else `latest`'s
  std::string out;              // "" = RUN_DIR/model.pt
  std::string key_file;         // the run's checkpoint.hmac_key_file for a sealed run; ""
};

// Writes model.pt; returns its path. InvalidArgument naming RUN_DIR or --step when there is no
// such checkpoint; CorruptData naming the file for a missing, damaged or foreign manifest,
// shard or state.krab (core/seal.h's rules for a sealed run: the seal is checked against the
// run directory and the model signature the file states).
std::string export_model_pt(const ExportOptions& options);

}  // namespace krab::train
