#include "core/flat.h"

#include <torch/torch.h>

#include "core/errors.h"

namespace krab::core {

int64_t total_numel(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType dtype) {
  if (tensors.empty()) return torch::zeros({0}, torch::TensorOptions().dtype(dtype));
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& t : tensors) parts.push_back(t.detach().reshape({-1}).to(dtype));
  return torch::cat(parts).contiguous();
}

void flatten_into(const std::vector<at::Tensor>& tensors, at::Tensor& flat, bool grads) {
  KRAB_CHECK_ARG(flat.dim() == 1 && flat.numel() == total_numel(tensors), "flat buffer of ",
                 flat.numel(), " elements for tensors of ", total_numel(tensors));
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (const auto& t : tensors) {
    auto dst = flat.narrow(0, off, t.numel());
    const at::Tensor& src = grads ? t.grad() : t;
    if (src.defined())
      dst.copy_(src.detach().reshape({-1}));
    else
      dst.zero_();
    off += t.numel();
  }
}

void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  KRAB_CHECK_ARG(flat.dim() == 1 && flat.numel() == total_numel(tensors), "flat tensor of ",
                 flat.numel(), " elements for tensors of ", total_numel(tensors));
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (const auto& t : tensors) {
    t.detach().copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

}  // namespace krab::core
