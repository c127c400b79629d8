#include "data/tensor_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/archive_walk.h"
#include "core/errors.h"
#include "core/printable.h"

namespace krab::data {
namespace {

using caffe2::serialize::PyTorchStreamReader;

constexpr const char* kExpected = "expected a file written by torch.save({'x': X, 'y': Y}, FILE)";

// LibTorch's message as one line of printable text: its messages quote the file's bytes (a
// global's name in the pickle, say) raw.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return core::printable(s, 400);
}

// --- What is checked before LibTorch reads the file --------------------------------------------
//
// LibTorch's archive reader and unpickler believe the sizes a file states (core/archive_walk.h):
// the zip directory and the pickle are walked first, and every size is checked against the
// bytes that are there.

constexpr const char* kArchive = "torch.save archive";

[[noreturn]] void damaged(const std::string& path, const std::string& why) {
  throw CorruptData(str_cat(path, ": damaged ", kArchive, ": ", why));
}

// Record name (without the archive's top folder, as PyTorchStreamReader names it) -> size.
using RecordSizes = core::ArchiveRecords;

RecordSizes check_directory(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return core::check_zip_directory(in, std::filesystem::file_size(path), path, kArchive);
}

// The storages one unpickling read or skipped, by the context pointer of their DataPtr (the
// only handle a tensor keeps on where its bytes came from), and the archive's record sizes.
struct StorageLog {
  RecordSizes records;                         // from the zip directory, before LibTorch
  std::map<const void*, std::string> skipped;  // placeholder context -> storage key
  std::map<const void*, std::string> read;     // real record context -> storage key
};

// A record of the archive; LibTorch's failure (a damaged or truncated zip) as CorruptData.
std::tuple<at::DataPtr, size_t> read_record(PyTorchStreamReader& reader, const std::string& name,
                                            const std::string& path) {
  try {
    return reader.getRecord(name);
  } catch (const c10::Error& e) {
    throw CorruptData(str_cat(path, ": damaged torch.save archive (record ", name,
                              "): ", one_line(e.what_without_backtrace())));
  }
}

// Unpickles `reader`'s data.pkl. Storage KEY's bytes are read when want(KEY); otherwise the
// tensor gets a placeholder without data (see the header), logged in *log.
c10::IValue unpickle(PyTorchStreamReader& reader, const std::string& path,
                     const std::function<bool(const std::string&)>& want, StorageLog* log) {
  if (log->records.count("data.pkl") == 0) damaged(path, "no data.pkl record");
  auto [pickle, pickle_size] = read_record(reader, "data.pkl", path);
  core::check_pickle(static_cast<const char*>(pickle.get()), pickle_size, path, "data.pkl");
  size_t pos = 0;
  auto read = [&, &pickle = pickle, pickle_size = pickle_size](char* out, size_t n) {
    n = std::min(n, pickle_size - pos);
    std::memcpy(out, static_cast<const char*>(pickle.get()) + pos, n);
    pos += n;
    return n;
  };
  auto record = [&](const std::string& key) -> at::DataPtr {
    const auto it = log->records.find("data/" + key);
    if (it == log->records.end())
      damaged(path, str_cat("no record for storage '", core::printable(key, 40), "'"));
    if (want(key)) {
      auto [bytes, size] = read_record(reader, it->first, path);
      log->read[bytes.get_context()] = key;
      return std::move(bytes);
    }
    auto* owned_key = new std::string(key);
    log->skipped[owned_key] = key;
    return at::DataPtr(
        nullptr, owned_key, [](void* p) { delete static_cast<std::string*>(p); }, at::kCPU);
  };
  // Every tensor onto the CPU, whatever device it was saved from (torch.load's map_location).
  torch::jit::Unpickler unpickler(read, nullptr, nullptr, record, at::Device(at::kCPU));
  try {
    return unpickler.parse_ivalue();
  } catch (const c10::Error& e) {
    throw InvalidArgument(str_cat(path,
                                  ": cannot unpickle what it holds (krab reads tensors, numbers, "
                                  "strings, lists and dicts, not other Python objects): ",
                                  one_line(e.what_without_backtrace())));
  } catch (const Error&) {
    throw;  // krab's own, from `record`
  } catch (const std::exception& e) {
    // The unpickler indexes its stack and tuples with at(): a pickle whose opcodes do not fit
    // together (too few arguments) ends here, as std::out_of_range.
    throw CorruptData(str_cat(path, ": damaged pickle (data.pkl): ", one_line(e.what())));
  }
}

// True when the file starts like a zip archive; a damaged one is then CorruptData, anything
// else is the wrong kind of file (InvalidArgument).
bool looks_like_zip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

// Opens and unpickles `path`, mapping LibTorch's errors to krab's, naming the file.
c10::IValue open_and_unpickle(const std::string& path,
                              const std::function<bool(const std::string&)>& want,
                              StorageLog* log) {
  KRAB_CHECK_ARG(std::filesystem::is_regular_file(path), "tensor file '", path,
                 "' does not exist or is not a file");
  KRAB_CHECK_ARG(looks_like_zip(path), path,
                 ": not a torch.save zip archive (torch.save(..., "
                 "_use_new_zipfile_serialization=False) files are not read); ",
                 kExpected);
  log->records = check_directory(path);
  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    throw CorruptData(
        str_cat(path, ": damaged torch.save archive: ", one_line(e.what_without_backtrace())));
  }
  return unpickle(*reader, path, want, log);
}

struct XY {
  at::Tensor x, y;
};

at::Tensor entry(const c10::impl::GenericDict& dict, const char* key, const std::string& path) {
  for (const auto& kv : dict)
    if (kv.key().isString() && kv.key().toStringRef() == key) {
      KRAB_CHECK_ARG(kv.value().isTensor(), path, ": '", key, "' is a ", kv.value().tagKind(),
                     ", not a tensor; ", kExpected);
      const at::Tensor t = kv.value().toTensor();
      KRAB_CHECK_ARG(t.layout() == at::kStrided && !t.is_quantized(), path, ": '", key, "' is a ",
                     t.is_quantized() ? "quantized" : "sparse", " tensor; krab reads dense ones");
      KRAB_CHECK_ARG(t.dim() >= 1, path, ": '", key,
                     "' is a scalar; it needs a first dimension, the examples");
      return t;
    }
  std::string keys;
  for (const auto& kv : dict)
    keys += (keys.empty() ? "" : ", ") +
            (kv.key().isString() ? "'" + core::printable(kv.key().toStringRef(), 40) + "'"
                                 : std::string(kv.key().tagKind()));
  throw InvalidArgument(str_cat(path, ": no key '", key, "' (the dict has ",
                                keys.empty() ? "no keys" : keys, "); ", kExpected));
}

XY parse(const c10::IValue& saved, const std::string& path) {
  KRAB_CHECK_ARG(saved.isGenericDict(), path, ": holds a ", saved.tagKind(), ", not a dict; ",
                 kExpected);
  const auto dict = saved.toGenericDict();
  XY xy{entry(dict, "x", path), entry(dict, "y", path)};
  KRAB_CHECK_ARG(xy.x.size(0) == xy.y.size(0), path, ": x has ", xy.x.size(0),
                 " examples but y has ", xy.y.size(0), " (their first dimensions must agree)");
  const at::ScalarType y = xy.y.scalar_type();
  KRAB_CHECK_ARG(integer_targets(y) || at::isFloatingType(y), path, ": y has dtype ", y,
                 "; targets must be integers (classes) or floating point");
  return xy;
}

// The elements `t`'s sizes state, or -1 when a size is negative or their product overflows.
int64_t stated_elements(const at::Tensor& t) {
  int64_t n = 1;
  for (const int64_t size : t.sizes())
    if (size < 0 || __builtin_mul_overflow(n, size, &n)) return -1;
  return n;
}

// A tensor's bytes must lie inside its storage, and its storage inside the record it came from
// (read or not): a damaged header could otherwise point the tensor past the bytes there. And it
// may not state more elements than its storage holds: a view with a zero stride (x.expand()) or
// overlapping strides passes the first check with any sizes, and compact() would copy it out in
// full (a 4 KB file stating 10^6 expanded images took 1.1 GB). With this, what a file makes
// krab allocate is bounded by its own size (8 x, for int8 labels widened to int64).
void check_extent(const at::Tensor& t, const StorageLog& log, const std::string& path,
                  const char* name) {
  const int64_t elements = stated_elements(t);
  if (elements == 0) return;
  const void* context = t.storage().data_ptr().get_context();
  auto key = log.read.find(context);
  if (key == log.read.end()) key = log.skipped.find(context);
  if (key == log.skipped.end())
    throw CorruptData(str_cat(path, ": a tensor whose bytes come from no storage record"));
  const uint64_t record = log.records.at("data/" + key->second);
  const std::string storage = core::printable(key->second, 40);
  // The last element's offset, in elements, without overflow: each size is >= 1 here (or
  // negative, which the count below refuses).
  int64_t last = t.storage_offset(), term = 0;
  bool ok = last >= 0;
  for (int64_t d = 0; ok && d < t.dim(); ++d)
    ok = t.stride(d) >= 0 && !__builtin_mul_overflow(t.size(d) - 1, t.stride(d), &term) &&
         !__builtin_add_overflow(last, term, &last);
  int64_t end_bytes = 0;
  ok = ok && !__builtin_mul_overflow(last + 1, static_cast<int64_t>(t.element_size()), &end_bytes);
  if (!ok || static_cast<uint64_t>(end_bytes) > t.storage().nbytes() ||
      t.storage().nbytes() > record)
    throw CorruptData(str_cat(path, ": a tensor of shape ", t.sizes(),
                              " reaches past its storage '", storage, "' of ", record, " bytes"));
  const int64_t held = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
  if (elements < 0 || elements > held)
    throw CorruptData(str_cat(path, ": '", name, "' of shape ", t.sizes(), " states ",
                              elements < 0 ? std::string("more") : std::to_string(elements),
                              " elements but its storage '", storage, "' holds ", held,
                              " (an expanded or overlapping view; save x.contiguous() instead)"));
}

// A tensor that owns exactly its own bytes, contiguous.
at::Tensor compact(const at::Tensor& t) {
  if (t.is_contiguous() && t.storage().nbytes() == t.nbytes()) return t;
  return t.clone(at::MemoryFormat::Contiguous);
}

TensorFileInfo describe(const XY& xy) {
  TensorFileInfo info;
  info.examples = xy.x.size(0);
  info.x_shape.assign(xy.x.sizes().begin() + 1, xy.x.sizes().end());
  info.y_shape.assign(xy.y.sizes().begin() + 1, xy.y.sizes().end());
  info.x_dtype = xy.x.scalar_type();
  info.y_dtype = xy.y.scalar_type();
  const int64_t y_item = integer_targets(info.y_dtype) ? 8 : xy.y.element_size();
  info.bytes = static_cast<int64_t>(xy.x.nbytes()) + xy.y.numel() * y_item;
  return info;
}

}  // namespace

bool integer_targets(at::ScalarType y_dtype) {
  return at::isIntegralType(y_dtype, /*includeBool=*/true);
}

TensorFileInfo inspect_tensor_file(const std::string& path, bool with_labels) {
  StorageLog header_log;
  const XY header = parse(open_and_unpickle(
                              path, [](const std::string&) { return false; }, &header_log),
                          path);
  check_extent(header.x, header_log, path, "x");
  check_extent(header.y, header_log, path, "y");
  TensorFileInfo info = describe(header);
  if (!with_labels) return info;
  if (header.y.numel() == 0) {
    info.labels = at::empty(header.y.sizes(), header.y.options());
    return info;
  }
  // Second pass: now that the header says which storage y lives in, read that one alone (x's
  // too when y is a view of the same storage; nothing distinguishes them then).
  const std::string y_key = header_log.skipped.at(header.y.storage().data_ptr().get_context());
  StorageLog log;
  const XY xy = parse(open_and_unpickle(
                          path, [&](const std::string& key) { return key == y_key; }, &log),
                      path);
  check_extent(xy.y, log, path, "y");
  info.labels = compact(xy.y);
  return info;
}

TensorDataset read_tensor_file(const std::string& path) {
  StorageLog log;
  const XY xy = parse(open_and_unpickle(
                          path, [](const std::string&) { return true; }, &log),
                      path);
  check_extent(xy.x, log, path, "x");
  check_extent(xy.y, log, path, "y");
  at::Tensor y = integer_targets(xy.y.scalar_type()) ? xy.y.to(at::kLong) : xy.y;
  return TensorDataset(compact(xy.x), compact(y));
}

}  // namespace krab::data
