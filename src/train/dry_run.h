// One training step of the job's model on the first examples of its data, run by whoever starts
// the training (the launcher of `krab train` before it spawns a worker, fl-sim and fl-client
// before their first round), so that a model that cannot take the data is refused with one line
// before any process, round or progress bar starts.
//
// What it runs is what a worker's step runs on its micro-batch: Model::forward in train mode,
// Model::loss (train.loss, or the module's own training_loss), backward. It runs on the first
// min(2, N) training examples (two, so that BatchNorm in train mode has a batch to normalise),
// plus, for a TorchScript model, check_model_fits_data (train/job.h: output shape and every
// label against the classes).
//
// It changes nothing: the model's parameters, buffers (BatchNorm's running statistics), gradients
// and train/eval mode are as before, and so is LibTorch's default random generator (a dropout in
// the forward draws from it; the state is restored), so a run with the check is bit-identical to
// one without.
#pragma once

#include <string>

#include "core/config.h"
#include "data/dataset.h"
#include "models/model.h"

namespace krab::train {

// Runs the step described above. Throws models::ForwardError (exit 2) when the forward, the loss
// or the backward fails in code krab did not write: one line naming the model (model.path 'F', or
// model.name 'mlp'), the data (data.path 'F', or data.name 'synthetic'), the phase and the
// library's cause, with what krab can tell of it: for inputs of another dtype than the model's
// parameters both dtypes; for a Linear layer that does not fit, the features it expects and the
// ones it got. When the library's text holds more than that line (a TorchScript traceback), it is
// written to a file in $TMPDIR (or /tmp) that the line names, and kept in the error's details()
// for --verbose. krab's own refusals (InvalidArgument naming model.path and the shapes, labels out
// of range) pass unchanged.
void dry_run(models::Model& model, const data::DataSplits& d, const core::Config& c);

// "model.path 'net.pt'" for a TorchScript model, "model.name 'mlp'" for a built-in one.
std::string name_model(const core::Config& c);
// "data.path 'train.pt'", or "data.name 'synthetic'" for data without a file.
std::string name_data(const core::Config& c);

}  // namespace krab::train
