#include "train/precision.h"

#include <ATen/autocast_mode.h>

#include "core/errors.h"
#include "models/forward_error.h"

namespace krab::train {

Precision parse_precision(const std::string& name) {
  if (name == "bf16") return Precision::kBf16;
  KRAB_CHECK_ARG(name == "fp32", "train.precision '", name, "': expected fp32 or bf16");
  return Precision::kFp32;
}

const char* precision_name(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp32";
}

// LibTorch 1.13 has no C++ RAII guard for autocast (Python's torch.autocast is one); this is
// what torch.autocast.__enter__/__exit__ do for the CPU.
AutocastGuard::AutocastGuard(Precision precision) : active_(precision == Precision::kBf16) {
  if (!active_) return;
  was_enabled_ = at::autocast::is_cpu_enabled();
  was_dtype_ = static_cast<int>(at::autocast::get_autocast_cpu_dtype());
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(was_enabled_);
  at::autocast::set_autocast_cpu_dtype(static_cast<at::ScalarType>(was_dtype_));
}

namespace {

[[noreturn]] void throw_precision_error(const std::string& cause) {
  throw InvalidArgument(
      str_cat("train.precision: bf16: this model's forward fails under LibTorch's bf16 autocast (",
              cause, "); use train.precision: fp32"));
}

}  // namespace

void explain_precision_failure(Precision precision, const std::function<void()>& step) {
  if (precision != Precision::kBf16) return step();
  try {
    step();
  } catch (const models::ForwardError& e) {
    // A TorchScript model reports its own forward's failure; its cause is LibTorch's line.
    throw_precision_error(e.cause());
  } catch (const Error&) {
    throw;  // krab's own errors (a non-finite loss, a lost peer) are not autocast's
  } catch (const std::exception& e) {
    // c10::Error from a built-in model's op, or the interpreter's error in backward: the
    // library's first line, without its backtrace.
    throw_precision_error(models::describe_library_error(e).cause);
  }
}

}  // namespace krab::train
