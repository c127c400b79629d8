// The launcher's checks of a job, before any worker starts (`krab train`): the job's keys, the
// data, the model against the data, the checkpoint to resume, room for disk offload. A job that
// would fail in every worker fails here instead, with one line and exit 2, before a process is
// spawned or a byte of the run directory written.
//
// The launcher never builds a model larger than it can afford (docs/design/zero-sharding.md
// §3.4, §5.2): a model that does not fit one worker is exactly what ZeRO trains, and building it
// in the launcher, next to the workers, would need its 4Ψ bytes (8Ψ with the dry run's
// gradients) on top of theirs. So the model's shapes come from its description
// (models::describe_parameters for the built-in models, the archive's storage sizes for a
// TorchScript file) and what needs a module depends on the model's size Ψ:
//
//   Ψ <= kWholeModelLimit   the model is built as the workers build it: the dry run
//                           (train/dry_run.h) trains one step of it on the first examples, a
//                           checkpoint to resume is decoded into it (every byte verified);
//   larger, mlp or gpt      the dry run runs on models::reduced_spec(), the same model kind with
//                           the same inputs and outputs (mlp hidden 8, gpt one block of width =
//                           heads): a dtype, token or label the model cannot take still fails
//                           here, with the same line. A sharded checkpoint's manifest is read and
//                           checked (job, parameter shapes, optimizer, seal); its shards, and a
//                           state.krab, are verified by the workers, which read them anyway;
//   larger, torchscript     nothing is loaded: the workers inspect the file and try it on the
//                           data, and verify the checkpoint (its seal is bound to the
//                           parameter shapes, which only the loaded file knows);
//   larger, cnn             (no smaller cnn takes the same images) as torchscript, but a sharded
//                           checkpoint's manifest is checked as for the other built-ins.
// When the model is above the limit, one line on stderr says what the launcher did not do.
// The launcher's peak memory is then the data it reads and a model of a few thousand values,
// whatever Ψ is (a test builds nothing for a 1.6 B-parameter gpt).
#pragma once

#include <cstdint>
#include <functional>

#include "core/config.h"
#include "data/dataset.h"

namespace krab::train {

// Parameters (or, for a TorchScript file, stored values) above which the launcher does not
// build the model: 32 Mi, 128 MiB of fp32 — 256 MiB with the dry run's gradients.
constexpr int64_t kWholeModelLimit = int64_t{1} << 25;

// What preflight() learned that the launcher needs to size the run.
struct PreflightInfo {
  int64_t parameters = 0;  // the model's parameter count (a TorchScript file above the
                           // limit: its stored values, buffers included)
  int64_t data_bytes = 0;  // the training and test tensors every worker loads
};

// Checks what can be checked before any process is spawned, as above: data present and
// readable, batch not larger than the data, the model able to take the data, the checkpoint
// resumable, the offload directory's room. Throws InvalidArgument / CorruptData naming the key or
// file, models::ForwardError for a model that cannot take its data (train/dry_run.h). `workers`
// is the total world size. `before_model`, when given, is called with the loaded data after the
// data checks and before any model is made (the launcher's memory check, cli::check_job_memory,
// which refuses a job too large for the node).
PreflightInfo preflight(const core::Config& config, int workers,
                        const std::function<void(const data::DataSplits&)>& before_model = {});

}  // namespace krab::train
