// Flat views of a list of tensors: the one copy of "lay these parameters (or their gradients)
// end to end in one 1-D tensor, and copy such a tensor back". Used by every layer that moves a
// model as one buffer: DataParallel's broadcast, local SGD's average, the parameter-server
// worker, federated clients.
//
// Layout: tensor i occupies elements [sum of numel of 0..i-1, + numel(i)) of the flat tensor,
// in row-major order. All functions work on detached data and never record autograd history.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace krab::core {

// Sum of numel() over `tensors`.
int64_t total_numel(const std::vector<at::Tensor>& tensors);

// A new contiguous 1-D tensor of `dtype` holding `tensors` end to end (an empty list gives a
// tensor of 0 elements).
at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType dtype = at::kFloat);

// Copies `tensors` (or, with `grads`, their .grad(); an undefined gradient is zeros) into the
// preallocated 1-D `flat` of total_numel(tensors) elements.
void flatten_into(const std::vector<at::Tensor>& tensors, at::Tensor& flat, bool grads = false);

// Copies `flat` back into `tensors` in place (the inverse of flatten_into). InvalidArgument
// when flat's size differs from total_numel(tensors).
void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors);

}  // namespace krab::core
