#include "train/checkpoint.h"

#include <torch/serialize.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "models/torchscript.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'K', 'R', 'A', 'B', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 4;

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
T get(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(v));
  return v;
}

uint32_t crc(const char* data, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  // zlib's length is uInt: feed large payloads in pieces.
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

// "parameter fc1.weight is [16, 32] in the checkpoint, [32, 32] in this job" for the first
// entry where two signatures ("name:shape;...") disagree.
std::string first_signature_difference(const std::string& saved, const std::string& job) {
  auto split = [](const std::string& s) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in(s);
    std::string item;
    while (std::getline(in, item, ';')) {
      const auto colon = item.rfind(':');
      out.emplace_back(item.substr(0, colon),
                       colon == std::string::npos ? "" : item.substr(colon + 1));
    }
    return out;
  };
  const auto a = split(saved), b = split(job);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i >= a.size()) return str_cat("parameter ", b[i].first, " is missing from the checkpoint");
    if (i >= b.size()) return str_cat("parameter ", a[i].first, " is not in this job's model");
    if (a[i].first != b[i].first)
      return str_cat("parameter #", i, " is ", a[i].first, " in the checkpoint, ", b[i].first,
                     " in this job");
    if (a[i].second != b[i].second)
      return str_cat("parameter ", a[i].first, " is ", a[i].second, " in the checkpoint, ",
                     b[i].second, " in this job");
  }
  return "the parameters match but the model name differs";
}

// Checks the frame around the payload (magic, format version, length, CRC-32) and returns
// the payload's length; the payload follows the kHeaderBytes header.
uint64_t check_frame(const std::string& bytes, const std::string& source) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw CorruptData(str_cat("checkpoint '", source, "' is not a krab checkpoint (bad header)"));
  const auto version = get<uint32_t>(bytes, 8);
  if (version != kVersion)
    throw CorruptData(str_cat("checkpoint '", source, "' has format version ", version,
                              "; this krab reads version ", kVersion));
  const auto length = get<uint64_t>(bytes, 12);
  const auto want_crc = get<uint32_t>(bytes, 20);
  if (bytes.size() - kHeaderBytes != length)
    throw CorruptData(str_cat("checkpoint '", source, "' is truncated or padded: header says ",
                              length, " payload bytes, file has ", bytes.size() - kHeaderBytes));
  if (crc(bytes.data() + kHeaderBytes, length) != want_crc)
    throw CorruptData(str_cat("checkpoint '", source, "' failed its CRC-32 check (corrupt)"));
  return length;
}

// Runs `read`, which reads from an archive whose bytes passed their CRC: they are what some
// writer wrote, but not necessarily krab, so any read can meet a missing entry or the wrong
// type, which LibTorch reports as c10::Error (or, for an unknown pickled class, TorchScript's
// ErrorReport). That is a corrupt file, not a bug; say so, naming it. krab's own errors pass.
template <typename Read>
void reading_archive(const std::string& source, Read&& read) {
  const auto corrupt = [&source](const char* why) {
    return CorruptData(str_cat("checkpoint '", source,
                               "' is not a valid krab checkpoint: ", core::printable(why)));
  };
  try {
    read();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw corrupt(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw corrupt(e.what());
  }
}

CheckpointMeta read_meta(torch::serialize::InputArchive& archive, const std::string& source) {
  CheckpointMeta meta;
  reading_archive(source, [&] {
    c10::IValue v;
    archive.read("meta.step", v);
    meta.step = v.toInt();
    archive.read("meta.model_name", v);
    meta.model_name = v.toStringRef();
    archive.read("meta.signature", v);
    meta.signature = v.toStringRef();
    archive.read("meta.global_batch", v);
    meta.global_batch = v.toInt();
    archive.read("meta.seed", v);
    meta.seed = v.toInt();
  });
  return meta;
}

// A checkpoint resumes only the job it was written for: the same model and global batch.
void check_resumable(const CheckpointMeta& meta, const CheckpointMeta& expect,
                     const std::string& source) {
  if (meta.model_name != expect.model_name || meta.signature != expect.signature)
    throw InvalidArgument(
        str_cat("checkpoint '", source, "' was written for ",
                meta.model_name == expect.model_name
                    ? str_cat("a different '", core::printable(meta.model_name), "' model")
                    : str_cat("model '", core::printable(meta.model_name), "', not this job's '",
                              expect.model_name, "'"),
                ": ", core::printable(first_signature_difference(meta.signature, expect.signature)),
                " (model.* keys must match to resume)"));
  if (meta.global_batch != expect.global_batch)
    throw InvalidArgument(str_cat("checkpoint '", source, "' was trained with global batch ",
                                  meta.global_batch, "; this job's global batch is ",
                                  expect.global_batch,
                                  " (workers x data.batch_size x "
                                  "train.grad_accum must match to resume)"));
}

// Restores parameters, buffers, optimizer state and the CPU generator from `archive`.
void restore_state(torch::serialize::InputArchive& archive, const std::string& source,
                   torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  // Every tensor is read and checked before any is copied, so a checkpoint whose tensors
  // contradict its signature leaves the model as it was. Copy into the existing tensors:
  // Module::load() swaps their storage with set_(), which the optimizer and DataParallel
  // (holding the same parameters) must not be exposed to.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, saved)
  const auto take = [&](const std::string& key, const at::Tensor& dest, bool is_buffer) {
    at::Tensor t;
    archive.read(key, t, is_buffer);
    if (!t.defined() || t.sizes() != dest.sizes() || t.scalar_type() != dest.scalar_type())
      throw CorruptData(str_cat("checkpoint '", source, "': '", key, "' does not match the ",
                                "model's tensor ", dest.sizes(), " ", dest.scalar_type()));
    copies.emplace_back(dest, t);
  };
  for (auto& item : module.named_parameters()) take("param." + item.key(), item.value(), false);
  for (auto& item : module.named_buffers()) take("buffer." + item.key(), item.value(), true);
  torch::serialize::InputArchive optim_archive;
  archive.read("optimizer", optim_archive);
  at::Tensor rng;
  archive.read("rng", rng, /*is_buffer=*/true);
  {
    torch::NoGradGuard no_grad;
    for (auto& [dest, saved] : copies) dest.copy_(saved);
  }
  optimizer.load(optim_archive);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rng);
}

}  // namespace

std::string model_signature(const torch::nn::Module& module) {
  std::ostringstream os;
  for (const auto& item : module.named_parameters())
    os << item.key() << ":" << item.value().sizes() << ";";
  return os.str();
}

std::string encode_checkpoint(const CheckpointMeta& meta, torch::nn::Module& module,
                              torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  archive.write("meta.step", c10::IValue(meta.step));
  archive.write("meta.model_name", c10::IValue(meta.model_name));
  archive.write("meta.signature", c10::IValue(meta.signature));
  archive.write("meta.global_batch", c10::IValue(meta.global_batch));
  archive.write("meta.seed", c10::IValue(meta.seed));
  for (const auto& item : module.named_parameters())
    archive.write("param." + item.key(), item.value().detach());
  for (const auto& item : module.named_buffers())
    archive.write("buffer." + item.key(), item.value().detach(), /*is_buffer=*/true);
  torch::serialize::OutputArchive optim_archive;
  optimizer.save(optim_archive);
  archive.write("optimizer", optim_archive);
  archive.write("rng", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);

  std::string payload;
  archive.save_to([&payload](const void* buf, size_t n) {
    payload.append(static_cast<const char*>(buf), n);
    return n;
  });
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  out.append(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, payload.size());
  put<uint32_t>(out, crc(payload.data(), payload.size()));
  out += payload;
  return out;
}

CheckpointMeta decode_checkpoint(const std::string& bytes, const std::string& source,
                                 const CheckpointMeta& expect, torch::nn::Module& module,
                                 torch::optim::Optimizer& optimizer) {
  const uint64_t length = check_frame(bytes, source);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data() + kHeaderBytes, length);
  } catch (const std::exception& e) {
    throw CorruptData(str_cat("checkpoint '", source, "' cannot be parsed"));
  }
  const CheckpointMeta meta = read_meta(archive, source);
  check_resumable(meta, expect, source);
  reading_archive(source, [&] { restore_state(archive, source, module, optimizer); });
  return meta;
}

std::string save_checkpoint(const std::string& run_dir, const std::string& bytes, int64_t step,
                            int keep) {
  const std::string name = step_dir_name(step);
  const std::string state = (fs::path(run_dir) / name / "state.krab").string();
  core::write_file_atomic(state, bytes);
  core::write_file_atomic((fs::path(run_dir) / "latest").string(), name + "\n");
  // Prune old step directories, newest `keep` stay (names sort by step).
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0)
      steps.push_back(e.path().filename().string());
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep < steps.size(); ++i)
    if (steps[i] != name) fs::remove_all(fs::path(run_dir) / steps[i], ec);
  return state;
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const std::string pointer = (fs::path(run_dir) / "latest").string();
  if (!core::path_exists(pointer)) return std::nullopt;
  std::string name = core::read_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  // Exactly what save_checkpoint writes: "step-" and the digits of a step. Checking the prefix
  // alone let "step-00000001\0junk" through, and the NUL then cut every path built from it.
  const bool digits = name.size() > 5 && name.size() <= 5 + 19 &&
                      name.find_first_not_of("0123456789", 5) == std::string::npos;
  if (name.rfind("step-", 0) != 0 || !digits)
    throw CorruptData(str_cat("'", pointer, "' does not name a step directory (it holds '",
                              core::printable(name), "')"));
  const std::string state = (fs::path(run_dir) / name / "state.krab").string();
  if (!core::path_exists(state))
    throw CorruptData(str_cat("'", pointer, "' points to '", state, "', which is missing"));
  return state;
}

void save_model_pt(const std::string& path, const torch::nn::Module& module) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& item : module.named_parameters()) dict.insert(item.key(), item.value().detach());
  for (const auto& item : module.named_buffers()) dict.insert(item.key(), item.value().detach());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  core::write_file_atomic(path, std::string(bytes.begin(), bytes.end()), core::FileAccess::kShared);
  // Every mode's final model goes through here, so every mode hands a user's module back.
  if (const auto* ts = dynamic_cast<const models::TorchScriptModel*>(&module))
    ts->save((std::filesystem::path(path).parent_path() / "model.ts").string());
}

}  // namespace krab::train
