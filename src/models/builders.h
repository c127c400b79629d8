// Internal to models/: one builder per architecture, called by make_model after it has checked
// the spec fields common to all. Each builder checks what is specific to its model and throws
// InvalidArgument naming the config key at fault.
#pragma once

#include <memory>

#include "models/model.h"

namespace krab::models::detail {

std::shared_ptr<Model> make_mlp(const ModelSpec& spec);
std::shared_ptr<Model> make_cnn(const ModelSpec& spec);
std::shared_ptr<Model> make_gpt(const ModelSpec& spec, BuildObserver* observer);  // its blocks

// Announces each of model's unit candidates to `observer` (if any), in order: for models built
// whole before they are announced (units.h: BuildObserver).
void announce_units(Model& model, BuildObserver* observer);
std::shared_ptr<Model> make_torchscript(const ModelSpec& spec);  // torchscript.cpp

// The checks make_model and describe_parameters share (models/describe.h): the spec fields
// common to the built-in models, then each model's own. Throw InvalidArgument naming the key.
void check_builtin_spec(const ModelSpec& spec);  // model.cpp
void check_mlp_spec(const ModelSpec& spec);      // classifiers.cpp
void check_cnn_spec(const ModelSpec& spec);      // classifiers.cpp
void check_gpt_spec(const ModelSpec& spec);      // gpt.cpp

}  // namespace krab::models::detail
