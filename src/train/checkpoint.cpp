#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/errors.h"
#include "core/file_source.h"
#include "core/fs.h"
#include "core/le_bytes.h"
#include "core/printable.h"
#include "core/record.h"
#include "core/seal.h"
#include "models/torchscript.h"
#include "train/model_file.h"
#include "train/optimizer_state.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'K', 'R', 'A', 'B', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 2;
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 4;

template <typename T>
void put(std::string& out, T v) {
  core::put_le(out, v);
}
template <typename T>
T get(const std::string& in, size_t at) {
  return core::get_le<T>(in, at);
}

uint32_t crc(const char* data, size_t n) { return crc32_update(0, data, n); }

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
  // Version 1 was a LibTorch archive, that is a TorchScript archive: parsing one runs the code a
  // forged file carries. It is refused on its version alone, before anything else is read.
  if (version == 1)
    throw CorruptData(str_cat(
        "checkpoint '", source,
        "' is in format version 1, a LibTorch archive that could run code when loaded; this krab "
        "no longer reads it: start the run afresh (checkpoint.resume: false, or a new run "
        "directory), or finish it with the krab that wrote it"));
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

}  // namespace

CheckpointMeta read_meta(const core::Record& in) {
  CheckpointMeta meta;
  meta.step = in.integer("meta.step");
  meta.model_name = in.text("meta.model_name");
  meta.signature = in.text("meta.signature");
  meta.global_batch = in.integer("meta.global_batch");
  meta.seed = in.integer("meta.seed");
  if (meta.step < 0)
    throw CorruptData(str_cat("checkpoint '", in.source(), "': meta.step is ", meta.step));
  if (in.has("meta.model_file")) {
    meta.model_file = in.text("meta.model_file");
    meta.model_sha256 = in.text("meta.model_sha256");
    if (meta.model_sha256.size() != 64 ||
        meta.model_sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw CorruptData(
          str_cat("checkpoint '", in.source(), "': meta.model_sha256 is not 64 hex digits"));
  }
  if (in.has("meta.adaptive_batch")) {
    const at::Tensor& t = in.tensor("meta.adaptive_batch");
    if (t.scalar_type() != at::kDouble || t.dim() != 1)
      throw CorruptData(
          str_cat("checkpoint '", in.source(), "': meta.adaptive_batch is not float64 numbers"));
    const at::Tensor v = t.contiguous();
    meta.adaptive_batch.assign(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
  }
  return meta;
}

void write_meta(const CheckpointMeta& meta, core::RecordEntries& out) {
  out.add_int("meta.step", meta.step);
  out.add_string("meta.model_name", meta.model_name);
  out.add_string("meta.signature", meta.signature);
  out.add_int("meta.global_batch", meta.global_batch);
  out.add_int("meta.seed", meta.seed);
  if (!meta.model_file.empty()) {
    out.add_string("meta.model_file", meta.model_file);
    out.add_string("meta.model_sha256", meta.model_sha256);
  }
  if (!meta.adaptive_batch.empty())
    out.add_tensor("meta.adaptive_batch",
                   torch::tensor(at::ArrayRef<double>(meta.adaptive_batch), torch::kFloat64));
}

void check_generator_state(const at::Tensor& rng, const std::string& source) {
  // The generator's state is checked on a fresh generator: set_state() refuses a state of the
  // wrong size or kind only when it is called, and by then nothing may have changed yet.
  const at::Generator gen = at::detail::getDefaultCPUGenerator();
  if (rng.scalar_type() != at::kByte || rng.dim() != 1 || rng.numel() != gen.get_state().numel())
    throw CorruptData(str_cat("checkpoint '", source, "': 'rng' is not a CPU generator state"));
  try {
    // A fresh generator, not gen.clone(): LibTorch 1.13's CPU clone leaks its copy.
    at::make_generator<at::CPUGeneratorImpl>().set_state(rng);
  } catch (const c10::Error& e) {
    throw CorruptData(str_cat("checkpoint '", source, "': 'rng' is not a CPU generator state: ",
                              core::printable(e.what_without_backtrace())));
  }
}

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

namespace {

// Restores parameters, buffers, optimizer state and the CPU generator from `in`.
void restore_state(const core::Record& in, torch::nn::Module& module,
                   torch::optim::Optimizer& optimizer) {
  // Every tensor is read and checked before any is copied, so a checkpoint whose tensors
  // contradict its signature leaves the model as it was. Copy into the existing tensors:
  // Module::load() swaps their storage with set_(), which the optimizer and DataParallel
  // (holding the same parameters) must not be exposed to.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, saved)
  const auto take = [&](const std::string& key, const at::Tensor& dest) {
    const at::Tensor& t = in.tensor(key);
    if (t.sizes() != dest.sizes() || t.scalar_type() != dest.scalar_type())
      throw CorruptData(str_cat("checkpoint '", in.source(), "': '", key, "' is ", t.sizes(), " ",
                                t.scalar_type(), ", the model's tensor ", dest.sizes(), " ",
                                dest.scalar_type()));
    copies.emplace_back(dest, t);
  };
  for (auto& item : module.named_parameters()) take("param." + item.key(), item.value());
  for (auto& item : module.named_buffers()) take("buffer." + item.key(), item.value());
  const auto install_optimizer = read_optimizer_state(in, optimizer);
  const at::Tensor& rng = in.tensor("rng");
  check_generator_state(rng, in.source());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    torch::NoGradGuard no_grad;
    for (auto& [dest, saved] : copies) dest.copy_(saved);
  }
  install_optimizer();
  gen.set_state(rng);
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const char* data, size_t n) {
  uLong c = crc;
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

std::string model_signature(const torch::nn::Module& module) {
  std::ostringstream os;
  for (const auto& item : module.named_parameters())
    os << item.key() << ":" << item.value().sizes() << ";";
  return os.str();
}

void write_state_entries(const CheckpointMeta& meta, torch::nn::Module& module,
                         torch::optim::Optimizer& optimizer, core::RecordEntries& out) {
  write_meta(meta, out);
  for (const auto& item : module.named_parameters())
    out.add_tensor("param." + item.key(), item.value());
  for (const auto& item : module.named_buffers())
    out.add_tensor("buffer." + item.key(), item.value());
  write_optimizer_state(optimizer, out);
  out.add_tensor("rng", at::detail::getDefaultCPUGenerator().get_state());
}

namespace {

// The frame's header: magic, version, the payload's length and CRC-32.
std::string frame_header(uint64_t length, uint32_t payload_crc) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, length);
  put<uint32_t>(out, payload_crc);
  return out;
}

// Takes the bytes into a CRC-32 and drops them.
class CrcSink : public core::ByteSink {
 public:
  void write(const char* data, size_t n) override { crc_ = crc32_update(crc_, data, n); }
  using core::ByteSink::write;
  uint32_t value() const { return crc_; }

 private:
  uint32_t crc_ = 0;
};

// Forwards to `out` while the seal sees every byte.
class SealingSink : public core::ByteSink {
 public:
  SealingSink(core::ByteSink& out, core::SealStream& seal) : out_(out), seal_(seal) {}
  void write(const char* data, size_t n) override {
    out_.write(data, n);
    seal_.update(data, n);
  }
  using core::ByteSink::write;

 private:
  core::ByteSink& out_;
  core::SealStream& seal_;
};

}  // namespace

void write_checkpoint(core::ByteSink& out, const core::RecordStreamWriter& record,
                      const std::string& seal_key, const std::string& job) {
  // The format puts the CRC in the header and the seal's HMAC runs over the header first, so
  // neither a placeholder patched afterwards nor a trailer fits without changing every file
  // and reader. The CRC therefore comes from a first pass over the tensors in place. The
  // in-memory encoder computed the same CRC over its copy; this costs reading the tensors once
  // more instead of copying them two to three times (record, frame, seal) and holding the copies.
  CrcSink payload_crc;
  record.write(payload_crc);
  core::SealStream seal(seal_key, job);
  SealingSink sealed(out, seal);
  sealed.write(frame_header(record.size(), payload_crc.value()));
  record.write(sealed);
  out.write(seal.finish());
}

std::string encode_checkpoint(const CheckpointMeta& meta, torch::nn::Module& module,
                              torch::optim::Optimizer& optimizer) {
  core::RecordStreamWriter record;
  write_state_entries(meta, module, optimizer, record);
  std::string out;
  out.reserve(kHeaderBytes + record.size());
  core::StringSink sink(out);
  write_checkpoint(sink, record, "", "");
  return out;
}

std::string frame_checkpoint(const std::string& payload) {
  std::string out = frame_header(payload.size(), crc(payload.data(), payload.size()));
  out.reserve(kHeaderBytes + payload.size());
  out += payload;
  return out;
}

core::Record parse_checkpoint(const std::string& bytes, const std::string& source) {
  const uint64_t length = check_frame(bytes, source);
  // The payload passed its CRC, so some writer wrote it, but not necessarily krab: the record
  // reader checks every entry, and the accessors refuse a missing or mistyped one.
  return core::Record::parse(bytes.data() + kHeaderBytes, length, source);
}

CheckpointMeta decode_checkpoint(const std::string& bytes, const std::string& source,
                                 const CheckpointMeta& expect, torch::nn::Module& module,
                                 torch::optim::Optimizer& optimizer) {
  const core::Record record = parse_checkpoint(bytes, source);
  const CheckpointMeta meta = read_meta(record);
  check_resumable(meta, expect, source);
  restore_state(record, module, optimizer);
  return meta;
}

std::string checkpoint_job(const std::string& run_dir, const std::string& signature) {
  return core::job_identity("train-checkpoint", run_dir, signature);
}

std::string read_checkpoint_file(const std::string& path, const std::string& seal_key,
                                 const std::string& job) {
  std::string bytes = core::read_file(path);
  if (bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0 &&
      get<uint32_t>(bytes, 8) == 1)
    check_frame(bytes, path);  // throws: version 1
  return core::unseal(std::move(bytes), seal_key, path, job);
}

core::RecordIndex open_checkpoint_file(const std::string& path, const std::string& seal_key,
                                       const std::string& job) {
  auto src = std::make_shared<core::FileSource>(path);
  const uint64_t size = src->size();
  std::string header(std::min<uint64_t>(size, kHeaderBytes), '\0');
  src->read(0, header.data(), header.size());
  const bool magic =
      header.size() == kHeaderBytes && std::memcmp(header.data(), kMagic, sizeof(kMagic)) == 0;
  if (magic && get<uint32_t>(header, 8) == 1) check_frame(header, path);  // throws: version 1
  const uint64_t body = size - core::sealed_length(*src, seal_key);
  const bool ours = magic && body >= kHeaderBytes;
  const uint64_t length = ours ? get<uint64_t>(header, 12) : 0;
  const bool framed = ours && body - kHeaderBytes == length;
  // One pass: the seal over the body, the CRC over the payload the header states.
  core::SealStream seal(seal_key, job);
  uint32_t sum = 0;
  constexpr uint64_t kChunk = 1 << 20;
  std::string chunk(std::min<uint64_t>(body, kChunk), '\0');
  for (uint64_t at = 0; at < body; at += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), body - at));
    src->read(at, chunk.data(), n);
    seal.update(chunk.data(), n);
    const uint64_t lo = std::max<uint64_t>(at, kHeaderBytes);
    if (framed && lo < at + n) sum = crc32_update(sum, chunk.data() + (lo - at), at + n - lo);
  }
  if (!seal_key.empty()) core::check_seal(seal, *src);
  if (!ours)
    throw CorruptData(str_cat("checkpoint '", path, "' is not a krab checkpoint (bad header)"));
  const auto version = get<uint32_t>(header, 8);
  if (version != kVersion)
    throw CorruptData(str_cat("checkpoint '", path, "' has format version ", version,
                              "; this krab reads version ", kVersion));
  if (!framed)
    throw CorruptData(str_cat("checkpoint '", path, "' is truncated or padded: header says ",
                              length, " payload bytes, file has ", body - kHeaderBytes));
  if (sum != get<uint32_t>(header, 20))
    throw CorruptData(str_cat("checkpoint '", path, "' failed its CRC-32 check (corrupt)"));
  return core::RecordIndex(std::move(src), kHeaderBytes, length, path);
}

std::string stated_signature(const std::string& step_dir) {
  std::string path = (fs::path(step_dir) / "manifest.krab").string();
  if (!core::path_exists(path)) path = (fs::path(step_dir) / "state.krab").string();
  auto src = std::make_shared<core::FileSource>(path);
  const uint64_t body = src->size() - (core::is_sealed(*src) ? 40 : 0);
  if (body < kHeaderBytes)
    throw CorruptData(str_cat("checkpoint '", path, "' is not a krab checkpoint (bad header)"));
  return core::RecordIndex(std::move(src), kHeaderBytes, body - kHeaderBytes, path)
      .text("meta.signature");
}

std::string save_checkpoint(const std::string& run_dir, const CheckpointMeta& meta,
                            torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                            const std::string& seal_key, const std::string& job, int keep) {
  core::RecordStreamWriter record;
  write_state_entries(meta, module, optimizer, record);
  const std::string state = (fs::path(run_dir) / step_dir_name(meta.step) / "state.krab").string();
  {
    // Until commit() the file is a temporary, removed when a write throws: `latest` below
    // moves only to a complete state.krab.
    core::AtomicFileWriter file(state);
    write_checkpoint(file, record, seal_key, job);
    file.commit();
  }
  publish_step(run_dir, meta.step, keep);
  return state;
}

std::string save_checkpoint(const std::string& run_dir, const std::string& bytes, int64_t step,
                            int keep) {
  const std::string name = step_dir_name(step);
  const std::string state = (fs::path(run_dir) / name / "state.krab").string();
  core::write_file_atomic(state, bytes);
  publish_step(run_dir, step, keep);
  return state;
}

void publish_step(const std::string& run_dir, int64_t step, int keep) {
  const std::string name = step_dir_name(step);
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
}

std::optional<std::string> latest_step_dir(const std::string& run_dir) {
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
  const std::string dir = (fs::path(run_dir) / name).string();
  const std::string state = (fs::path(dir) / "state.krab").string();
  if (!core::path_exists(state) && !core::path_exists((fs::path(dir) / "manifest.krab").string()))
    throw CorruptData(str_cat("'", pointer, "' points to '", state, "', which is missing"));
  return dir;
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const auto dir = latest_step_dir(run_dir);
  if (!dir) return std::nullopt;
  const std::string state = (fs::path(*dir) / "state.krab").string();
  if (!core::path_exists(state))
    throw CorruptData(str_cat("'", (fs::path(run_dir) / "latest").string(), "' points to '", state,
                              "', which is missing (a sharded checkpoint: manifest.krab)"));
  return state;
}

void save_model_pt(const std::string& path, const torch::nn::Module& module) {
  // Streamed tensor by tensor (train/model_file.h): never a second copy of the model.
  core::AtomicFileWriter file(path, core::FileAccess::kShared);
  TorchSaveWriter out(file);
  for (const auto& item : module.named_parameters()) out.add(item.key(), item.value());
  for (const auto& item : module.named_buffers()) out.add(item.key(), item.value());
  out.finish();
  file.commit();
  // Every mode's final model goes through here, so every mode hands a user's module back —
  // unless its file changed during the run: its code is no longer what trained (model.pt
  // holds the weights; the run is not failed at its end for it).
  if (const auto* ts = dynamic_cast<const models::TorchScriptModel*>(&module)) {
    const std::string change = models::script_file_change(ts->file());
    if (change.empty())
      ts->save((std::filesystem::path(path).parent_path() / "model.ts").string());
    else
      std::fprintf(stderr, "krab: warning: model.ts not written: the model file %s\n",
                   change.c_str());
  }
}

}  // namespace krab::train

namespace krab::train {

void save_model_pt(const std::string& path, engine::Engine& engine, bool write) {
  const models::Model& model = engine.model();
  if (dynamic_cast<const models::TorchScriptModel*>(&model) != nullptr) {
    // model.ts saves the live module: it must be whole (it was, when it was loaded).
    engine.with_whole_model([&] {
      if (write) save_model_pt(path, model);
    });
    return;
  }
  std::optional<core::AtomicFileWriter> file;
  std::optional<TorchSaveWriter> out;
  if (write) {
    file.emplace(path, core::FileAccess::kShared);
    out.emplace(*file);
  }
  const bool visited = engine.visit_parameters([&](const std::string& name, const at::Tensor& t) {
    if (out) out->add(name, t);
  });
  if (!write) return;
  if (!visited)
    for (const auto& item : model.named_parameters()) out->add(item.key(), item.value());
  for (const auto& item : model.named_buffers()) out->add(item.key(), item.value());
  out->finish();
  file->commit();
}

}  // namespace krab::train
