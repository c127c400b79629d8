#include "models/script_file.h"

#include <torch/csrc/jit/serialization/export.h>
#include <torch/script.h>

#include <exception>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "core/file_source.h"
#include "core/fs.h"
#include "core/seal.h"
#include "models/script_inspection.h"

namespace krab::models {
namespace {

std::string sha256_of_file(const std::string& path) {
  const core::FileSource file(path);
  core::Sha256Stream sha;
  std::string chunk(std::min<uint64_t>(file.size(), 1 << 20), '\0');
  for (uint64_t at = 0; at < file.size(); at += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), file.size() - at));
    file.read(at, chunk.data(), n);
    sha.update(chunk.data(), n);
  }
  return sha.hex();
}

}  // namespace

ScriptFile script_file_of(const std::string& path) {
  ScriptFile f;
  f.path = std::filesystem::absolute(path).lexically_normal().string();
  f.sha256 = sha256_of_file(f.path);
  return f;
}

std::string script_file_change(const ScriptFile& file) {
  if (!core::path_exists(file.path)) return str_cat("'", file.path, "' is missing");
  const std::string now = sha256_of_file(file.path);
  if (now == file.sha256) return "";
  return str_cat("'", file.path, "' changed since the run loaded it: its SHA-256 is ", now,
                 ", the run's was ", file.sha256);
}

void save_script_with_weights(const ScriptFile& file, bool trust_code, const WeightFill& fill,
                              const std::string& out, const std::string& advice) {
  const std::string change = script_file_change(file);
  KRAB_CHECK_ARG(change.empty(), "model.ts: the model file ", change,
                 "; its code is not the code these weights were trained with");
  const std::string source = str_cat("model file '", file.path, "'");
  torch::jit::Module m;
  if (trust_code) {
    std::ifstream in(file.path, std::ios::binary);
    m = load_torchscript_unchecked(in, source);
  } else {
    m = load_inspected_torchscript_file(file.path, source, advice);
  }
  {
    torch::NoGradGuard no_grad;
    // Names as the run's model knows them (the mirror registers the same full names).
    for (const auto& p : m.named_parameters(/*recurse=*/true)) {
      at::Tensor t = p.value;
      fill(p.name, t);
    }
    for (const auto& b : m.named_buffers(/*recurse=*/true)) {
      at::Tensor t = b.value;
      fill(b.name, t);
    }
  }
  m.eval();
  // Streamed: the serialiser's writes go straight to the temporary file. A sink failure is
  // reported by the zip writer as its own error; the sink's, which names the file, is rethrown.
  core::AtomicFileWriter sink(out, core::FileAccess::kShared);
  std::exception_ptr failure;
  const auto write = [&](const void* data, size_t n) -> size_t {
    try {
      sink.write(static_cast<const char*>(data), n);
      return n;
    } catch (...) {
      failure = std::current_exception();
      return 0;
    }
  };
  try {
    torch::jit::ExportModule(m, write);
  } catch (const c10::Error&) {
    if (failure) std::rethrow_exception(failure);
    throw;
  }
  sink.commit();
}

}  // namespace krab::models
