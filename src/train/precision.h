// train.precision: the arithmetic a training step's forward runs in (docs/design/
// zero-sharding.md §6.1; docs/config.md).
//
//   fp32  everything in float32 (krab's behaviour before the key existed).
//   bf16  the forward and the loss run under LibTorch's CPU autocast with bfloat16: matrix
//         products and convolutions (linear, matmul, bmm, conv*) compute in bf16, the losses in
//         fp32, the other operations in their inputs' type. Backward follows the types autograd
//         recorded, so the gradients of the fp32 parameters come back fp32. Parameters (the
//         master weights) and optimizer state stay fp32; evaluation stays fp32.
//
// Only the loop's `model.training_loss(x, y)` is wrapped (train/trainer.cpp). Autocast state is
// per thread, so thread-ranks each set their own.
#pragma once

#include <functional>
#include <string>

namespace krab::train {

enum class Precision { kFp32, kBf16 };

// "fp32" | "bf16"; InvalidArgument naming train.precision for anything else.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

// While alive, this thread's forward runs in `precision` (bf16: CPU autocast on, dtype
// bfloat16, one nesting level; on destruction the previous state comes back and, when the
// nesting returns to 0, autocast's cache of cast weights is cleared so no stale bf16 copy of a
// weight survives the optimizer step). kFp32 does nothing. Not copyable; use on one thread.
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool was_enabled_ = false;
  int was_dtype_ = 0;  // at::ScalarType, kept as int to keep ATen out of this header
};

// Runs `step` (a training step's forward and backward). Under bf16 a failure of the model's
// own computation in it — a c10::Error from an op, the TorchScript interpreter's error, a
// models::ForwardError — is rethrown as InvalidArgument (exit 2: the job asks for something
// this model cannot do) "train.precision: bf16: this model's forward fails under LibTorch's
// bf16 autocast (<LibTorch's first line>); use train.precision: fp32". The case it is for: an
// operation autocast leaves in bf16 meets an fp32 operand it cannot take, such as layer_norm of
// a linear's bf16 output with fp32 weights in LibTorch 1.13. krab's own errors (krab::Error)
// and everything under fp32 propagate unchanged.
void explain_precision_failure(Precision precision, const std::function<void()>& step);

}  // namespace krab::train
