// Checkpoints: everything needed to continue a run exactly where it stopped.
//
// Layout of a run directory:
//   runs/NAME/step-00000100/state.krab   model + optimizer + step + RNG + model signature
//   runs/NAME/latest                     text: the name of the newest complete step directory
//   runs/NAME/model.pt                   final parameters, name -> tensor, for Python torch.load
//
// state.krab = header (magic "KRABCKPT", format version 2, payload length, CRC-32 of the
// payload) + a record (core/record.h: data only, read by a validating reader; nothing in a
// checkpoint is handed to a LibTorch parser) holding
//   meta.step meta.model_name meta.signature meta.global_batch meta.seed   (CheckpointMeta)
//   meta.model_file meta.model_sha256                  (TorchScript runs: the file, for export)
//   meta.adaptive_batch               (train.adaptive_batch: its schedule so far, float64 numbers)
//   param.NAME, buffer.NAME                                              (the module's tensors)
//   optimizer.*                                       (train/optimizer_state.h: SGD, Adam, AdamW)
//   rng                                               (the CPU generator's state, uint8)
// Version 1 files (a LibTorch archive, which is a TorchScript archive: loading one ran the code
// inside it) are refused with CorruptData saying so. Files are streamed (never held whole in
// memory: save_checkpoint) and written atomically (temp, fsync, rename), and `latest` moves
// only after the step directory is complete, so a crash mid-write leaves the previous
// checkpoint in force. Loading verifies magic, length and CRC before parsing, and
// compares the model signature (parameter names and shapes) with the job's model: a corrupt,
// truncated or foreign checkpoint is refused with CorruptData / InvalidArgument, never loaded.
//
// The data position is the global step: the sampler is a pure function of (seed, step), so a
// resumed run sees exactly the batches the uninterrupted run would have seen.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/byte_sink.h"
#include "core/record.h"
#include "engine/engine.h"

namespace krab::train {

struct CheckpointMeta {
  int64_t step = 0;          // optimizer steps completed
  std::string model_name;    // "cnn", ...
  std::string signature;     // see model_signature()
  int64_t global_batch = 0;  // the determinism contract needs the same global batch on resume
  int64_t seed = 0;
  // A TorchScript run's model file as it loaded it (models/script_file.h): absolute path and
  // SHA-256, so that `krab export` writes model.ts from the same code. "" for built-in models
  // and for checkpoints written before krab recorded them. Not part of resumability.
  std::string model_file{}, model_sha256{};
  // train.adaptive_batch's state at this step (AdaptiveBatch::save): the batch schedule so far
  // and the noise averages, as meta.adaptive_batch (float64). Empty for a fixed batch.
  std::vector<double> adaptive_batch{};
};

// "name:shape;name:shape;..." over the module's parameters, in registration order.
std::string model_signature(const torch::nn::Module& module);

// The full state's entries, in state.krab's order: meta.*, param.*, buffer.*, optimizer.*, rng.
// To a core::RecordStreamWriter they are handles to the module's and optimizer's own tensors
// (nothing copied): those must not change until the writer has written them. NotSupported for
// an optimizer other than SGD, Adam and AdamW.
void write_state_entries(const CheckpointMeta& meta, torch::nn::Module& module,
                         torch::optim::Optimizer& optimizer, core::RecordEntries& out);

// Streams a state.krab to `out`: the version 2 frame around `record`, then the seal under
// `seal_key` for `job` when the key is not "". The frame's header holds the payload's CRC-32
// and the seal covers the header, so the record is written twice: once into the CRC alone, once
// to `out`. Memory beyond the record's tensors: one entry made contiguous at a time (none for a
// model's own, contiguous tensors) — never the file. The bytes are exactly those of
// core::seal(frame_checkpoint(record's bytes), seal_key, job). Throws what the sink throws;
// nothing is written after a throw.
void write_checkpoint(core::ByteSink& out, const core::RecordStreamWriter& record,
                      const std::string& seal_key, const std::string& job);

// The full state as unsealed bytes (header + record): write_checkpoint() into a string, so
// there is one encoder. For tests and fuzz seeds; a run writes through save_checkpoint() below,
// which never holds the file. NotSupported as write_state_entries().
std::string encode_checkpoint(const CheckpointMeta& meta, torch::nn::Module& module,
                              torch::optim::Optimizer& optimizer);

// Verifies and loads, all or nothing: every entry is read and checked before the module, the
// optimizer or the generator changes. `source` names the file in messages. Throws CorruptData
// when the bytes fail their checks (a version 1 file included), InvalidArgument when the
// checkpoint belongs to another model, optimizer or global batch size, NotSupported for an
// optimizer other than SGD, Adam and AdamW.
CheckpointMeta decode_checkpoint(const std::string& bytes, const std::string& source,
                                 const CheckpointMeta& expect, torch::nn::Module& module,
                                 torch::optim::Optimizer& optimizer);

// What a sealed checkpoint is bound to (core/seal.h): core::job_identity() of the run directory
// and the model signature. A sealed state.krab copied from another run fails its seal.
std::string checkpoint_job(const std::string& run_dir, const std::string& signature);

// The bytes of `path` for decode_checkpoint(), unsealed (core::unseal with `seal_key` and
// `job`). A version 1 file is refused first, by its header alone, so that its message says what
// it is rather than that its seal (made before seals were bound to jobs) fails.
std::string read_checkpoint_file(const std::string& path, const std::string& seal_key,
                                 const std::string& job);

// read_checkpoint_file() + parse_checkpoint() without holding the file: the file at `path`
// (state.krab or a manifest) is checked in one streaming pass (the version 1 refusal first, by
// its header; then the seal, the frame and the CRC, with the same messages) and its record
// indexed; the index keeps the file open and reads entries in place (core/record.h). The
// checkpoint reader's path: restoring a rank's ranges of a large state.krab reads those ranges.
core::RecordIndex open_checkpoint_file(const std::string& path, const std::string& seal_key,
                                       const std::string& job);

// The model signature the checkpoint in `step_dir` (its manifest.krab, else its state.krab)
// states, read before its seal is checked (only its entry headers and that entry): a seal binds
// the run directory and the signature, so a job is named by what the file says and the seal
// then proves it (a forged signature fails the seal like any other change). CorruptData naming
// the file when it has no such entry.
std::string stated_signature(const std::string& step_dir);

// --- Pieces the sharded checkpoints (train/sharded_checkpoint.h) and the reader of both
// formats (train/checkpoint_reader.h) share with state.krab ---------------------------------

// "step-00000100".
std::string step_dir_name(int64_t step);
// The meta.* entries of CheckpointMeta (meta.model_file and meta.model_sha256 only when set);
// read_meta() checks meta.step >= 0 and a recorded SHA-256's form (CorruptData).
void write_meta(const CheckpointMeta& meta, core::RecordEntries& out);
CheckpointMeta read_meta(const core::Record& in);
// InvalidArgument naming `source` unless `meta` is for `expect`'s model (name and signature)
// and global batch.
void check_resumable(const CheckpointMeta& meta, const CheckpointMeta& expect,
                     const std::string& source);
// CorruptData naming `source` unless `rng` is a state the CPU generator accepts; changes nothing.
void check_generator_state(const at::Tensor& rng, const std::string& source);
// The version 2 frame (magic, version, length, CRC-32) around a record's bytes, and the checked
// record back out of it (CorruptData naming `source`): state.krab and a sharded manifest.
std::string frame_checkpoint(const std::string& payload);
core::Record parse_checkpoint(const std::string& bytes, const std::string& source);
// zlib's CRC-32 continued over `n` more bytes (start with 0).
uint32_t crc32_update(uint32_t crc, const char* data, size_t n);

// A stage-0 checkpoint (a full replica: the periodic and the final one) of `module` and
// `optimizer` at step meta.step: streams step-N/state.krab (write_state_entries +
// write_checkpoint, sealed under `seal_key` for `job` when the key is not "") through
// core::AtomicFileWriter, then moves `latest` and prunes all but the newest `keep` step
// directories. Memory: O(the largest non-contiguous tensor), not O(the model); the tensors must
// not change meanwhile (the caller settled the engine). A failed write (a full disk) throws
// krab::Error naming the file and leaves no state.krab, `latest` where it was and the previous
// checkpoint in force. Returns the state file's path.
std::string save_checkpoint(const std::string& run_dir, const CheckpointMeta& meta,
                            torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                            const std::string& seal_key, const std::string& job, int keep);

// The same for a state file already in memory (`bytes`, as encode_checkpoint + core::seal
// give): tests and small payloads.
std::string save_checkpoint(const std::string& run_dir, const std::string& bytes, int64_t step,
                            int keep);

// Moves `latest` to step directory `step` (complete by now) and prunes all but the newest
// `keep` step directories.
void publish_step(const std::string& run_dir, int64_t step, int keep);

// Path of the state file `latest` points to, or nullopt if the run has no checkpoint.
// CorruptData when `latest` is not a step name or its directory holds no state.krab (a sharded
// checkpoint's directory holds manifest.krab: latest_step_dir()).
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
// The step directory `latest` points to, of either format (state.krab or manifest.krab), or
// nullopt if the run has no checkpoint; CorruptData as latest_checkpoint().
std::optional<std::string> latest_step_dir(const std::string& run_dir);

// Writes the parameters and buffers as a name -> tensor dict readable by Python's torch.load.
// For a TorchScript model (models/torchscript.h) it also writes `model.ts` in the same
// directory: the scripted module with these weights, in eval mode, for torch.jit.load.
void save_model_pt(const std::string& path, const torch::nn::Module& module);
// The same for `engine`'s model, called by every rank of the engine's group (collective: an
// engine that frees its parameters, ZeRO stage 3, gathers them unit by unit for it —
// Engine::visit_parameters — or all at once for a TorchScript model's model.ts); the rank with
// `write` writes the files, the others only take part in the gathers.
void save_model_pt(const std::string& path, engine::Engine& engine, bool write);

}  // namespace krab::train
