#include "data/tensor_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

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
// LibTorch's archive reader and unpickler believe the sizes a file states: a record's size in
// the zip directory, a string's length or a memo index in the pickle. A forged file could make
// them allocate gigabytes (docs/fuzzing.md). So the zip directory and the pickle are walked here
// first, and every size is checked against the bytes that are there.

uint64_t le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

[[noreturn]] void damaged(const std::string& path, const std::string& why) {
  throw CorruptData(str_cat(path, ": damaged torch.save archive: ", why));
}

// Record name (without the archive's top folder, as PyTorchStreamReader names it) -> size.
using RecordSizes = std::map<std::string, uint64_t>;

// Where the central directory is, from the end-of-directory records (zip64's when present:
// torch.save always writes one).
std::pair<uint64_t, uint64_t> directory_span(std::ifstream& in, uint64_t file_size,
                                             const std::string& path) {
  const uint64_t tail_size = std::min<uint64_t>(file_size, 22 + 65535 + 20 + 56);
  std::string tail(tail_size, '\0');
  in.seekg(static_cast<std::streamoff>(file_size - tail_size));
  if (!in.read(tail.data(), static_cast<std::streamsize>(tail_size)))
    damaged(path, "cannot read its end");
  const size_t end = tail.rfind(std::string("PK\x05\x06", 4));
  if (end == std::string::npos || tail.size() - end < 22) damaged(path, "no zip directory");
  uint64_t size = le(&tail[end + 12], 4), offset = le(&tail[end + 16], 4);
  if (end >= 20 && tail.compare(end - 20, 4, "PK\x06\x07", 4) == 0) {
    const uint64_t at = le(&tail[end - 20 + 8], 8);  // the zip64 end record's file offset
    const uint64_t tail_start = file_size - tail_size, end_at = tail_start + end;
    if (at < tail_start || at > end_at || end_at - at < 56 ||
        tail.compare(at - tail_start, 4, "PK\x06\x06", 4) != 0)
      damaged(path, "bad zip64 directory record");
    size = le(&tail[at - tail_start + 40], 8);
    offset = le(&tail[at - tail_start + 48], 8);
  }
  if (offset > file_size || size > file_size - offset)
    damaged(path, "zip directory out of the file");
  return {offset, size};
}

// The zip64 extra field's values of a directory entry, where its 32-bit fields say 0xFFFFFFFF.
void zip64_fields(const char* extra, size_t n, uint64_t* uncompressed, uint64_t* compressed,
                  uint64_t* local) {
  for (size_t at = 0; at + 4 <= n;) {
    const uint64_t id = le(extra + at, 2), len = le(extra + at + 2, 2);
    if (at + 4 + len > n) return;
    if (id == 1) {
      size_t field = at + 4;
      for (uint64_t* v : {uncompressed, compressed, local})
        if (*v == 0xFFFFFFFF && field + 8 <= at + 4 + len) *v = le(extra + field, 8), field += 8;
      return;
    }
    at += 4 + len;
  }
}

// Every record of the archive at `path`: stored (torch.save never compresses; a compressed
// record's stated size would be believed before inflating), and inside the file.
RecordSizes check_directory(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const uint64_t file_size = std::filesystem::file_size(path);
  const auto [offset, size] = directory_span(in, file_size, path);
  std::string dir(size, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(dir.data(), static_cast<std::streamsize>(size))) damaged(path, "short directory");
  RecordSizes records;
  for (size_t at = 0; at + 46 <= dir.size();) {
    if (dir.compare(at, 4, "PK\x01\x02", 4) != 0) damaged(path, "bad zip directory entry");
    const uint64_t method = le(&dir[at + 10], 2), name_len = le(&dir[at + 28], 2),
                   extra_len = le(&dir[at + 30], 2), comment_len = le(&dir[at + 32], 2);
    uint64_t compressed = le(&dir[at + 20], 4), uncompressed = le(&dir[at + 24], 4);
    uint64_t local = le(&dir[at + 42], 4);
    if (at + 46 + name_len + extra_len + comment_len > dir.size())
      damaged(path, "zip directory entry out of the directory");
    const std::string name = dir.substr(at + 46, name_len);
    zip64_fields(&dir[at + 46 + name_len], extra_len, &uncompressed, &compressed, &local);
    const std::string shown = core::printable(name, 60);
    if (method != 0)
      damaged(path, str_cat("record ", shown, " is compressed (torch.save stores records)"));
    if (compressed != uncompressed || local > file_size || uncompressed > file_size - local)
      damaged(path, str_cat("record ", shown, " states ", uncompressed, " bytes at offset ", local,
                            ", past the end of the file"));
    const size_t slash = name.find('/');
    records[slash == std::string::npos ? name : name.substr(slash + 1)] = uncompressed;
    at += 46 + name_len + extra_len + comment_len;
  }
  return records;
}

// One pickle opcode (protocols 0 to 5): its argument and its effect on the stack.
struct Opcode {
  unsigned char code;
  // '-': none; '1' '2' '4' '8': that many bytes; 'a' 'b' 'c': a length of 1, 4 or 8 bytes, then
  // that many bytes; 'm' 'M': a memo index of 1 or 4 bytes; 'n': a line; 'N': two lines.
  char argument;
  int take;  // stack items taken: kMark pushes a mark, kToMark takes the items above the
             // innermost mark and the mark, kToMarkAndOne those and one more item below
  int give;  // stack items given
};
constexpr int kMark = -1, kToMark = -2, kToMarkAndOne = -3;
constexpr Opcode kOpcodes[] = {
    {'(', '-', kMark, 0},    {'.', '-', 1, 0},
    {'0', '-', 1, 0},        {'1', '-', kToMark, 0},
    {'2', '-', 1, 2},        {'F', 'n', 0, 1},
    {'I', 'n', 0, 1},        {'J', '4', 0, 1},
    {'K', '1', 0, 1},        {'L', 'n', 0, 1},
    {'M', '2', 0, 1},        {'N', '-', 0, 1},
    {'P', 'n', 0, 1},        {'Q', '-', 1, 1},
    {'R', '-', 2, 1},        {'S', 'n', 0, 1},
    {'T', 'b', 0, 1},        {'U', 'a', 0, 1},
    {'V', 'n', 0, 1},        {'X', 'b', 0, 1},
    {'a', '-', 2, 1},        {'b', '-', 2, 1},
    {'c', 'N', 0, 1},        {'d', '-', kToMark, 1},
    {'}', '-', 0, 1},        {'e', '-', kToMarkAndOne, 1},
    {'g', 'n', 0, 1},        {'h', 'm', 0, 1},
    {'i', 'N', kToMark, 1},  {'j', 'M', 0, 1},
    {'l', '-', kToMark, 1},  {']', '-', 0, 1},
    {'o', '-', kToMark, 1},  {'p', 'n', 1, 1},
    {'q', 'm', 1, 1},        {'r', 'M', 1, 1},
    {'s', '-', 3, 1},        {'t', '-', kToMark, 1},
    {')', '-', 0, 1},        {'u', '-', kToMarkAndOne, 1},
    {'G', '8', 0, 1},        {'B', 'b', 0, 1},
    {'C', 'a', 0, 1},        {0x80, '1', 0, 0},
    {0x81, '-', 2, 1},       {0x82, '1', 0, 1},
    {0x83, '2', 0, 1},       {0x84, '4', 0, 1},
    {0x85, '-', 1, 1},       {0x86, '-', 2, 1},
    {0x87, '-', 3, 1},       {0x88, '-', 0, 1},
    {0x89, '-', 0, 1},       {0x8a, 'a', 0, 1},
    {0x8b, 'b', 0, 1},       {0x8c, 'a', 0, 1},
    {0x8d, 'c', 0, 1},       {0x8e, 'c', 0, 1},
    {0x8f, '-', 0, 1},       {0x90, '-', kToMarkAndOne, 1},
    {0x91, '-', kToMark, 1}, {0x92, '-', 3, 1},
    {0x93, '-', 2, 1},       {0x94, '-', 1, 1},
    {0x95, '8', 0, 0},       {0x96, 'c', 0, 1},
    {0x97, '-', 0, 1},       {0x98, '-', 1, 1},
};

// The pickle walked without being run, so that LibTorch's unpickler only sees a pickle that
// stays inside its bytes and its stack:
//  - every length fits in what remains, and every memo index is below the pickle's size (a
//    writer numbers them from 0, at most one per opcode; the unpickler grows its memo table
//    to the index it reads);
//  - no opcode takes more stack items than there are above the innermost mark, as Python's
//    unpickler requires (LibTorch's takes them with back() and end() - 2, unchecked: a fuzzed
//    BUILD on a one-item stack read freed memory);
//  - every opcode is pickle's, and the pickle ends with STOP.
class PickleWalk {
 public:
  PickleWalk(const char* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}

  void run() {
    static const std::array<const Opcode*, 256> table = [] {
      std::array<const Opcode*, 256> t{};
      for (const Opcode& op : kOpcodes) t[op.code] = &op;
      return t;
    }();
    while (at_ < n_) {
      const auto code = static_cast<unsigned char>(p_[at_++]);
      const Opcode* op = table[code];
      if (op == nullptr) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", code);
        bad(str_cat("opcode ", hex, " is not pickle's"));
      }
      argument(op->argument);
      stack(*op);
      if (code == '.') return;
    }
    bad("no STOP opcode");
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    throw CorruptData(str_cat(path_, ": damaged pickle (data.pkl) at byte ", at_, ": ", why));
  }
  uint64_t take(uint64_t k) {
    if (k > n_ - at_) bad(str_cat("a length of ", k, " runs past its end"));
    const uint64_t v = k <= 8 ? le(p_ + at_, static_cast<int>(k)) : 0;
    at_ += k;
    return v;
  }
  void line() {
    const void* nl = std::memchr(p_ + at_, '\n', n_ - at_);
    if (nl == nullptr) bad("an unterminated line");
    at_ = static_cast<const char*>(nl) - p_ + 1;
  }
  void argument(char kind) {
    if (kind >= '1' && kind <= '8') take(kind - '0');
    if (kind == 'a' || kind == 'b' || kind == 'c')
      take(take(kind == 'a' ? 1 : kind == 'b' ? 4 : 8));
    if (kind == 'm' || kind == 'M') {
      const uint64_t index = take(kind == 'm' ? 1 : 4);
      if (index > n_) bad(str_cat("memo index ", index, " in a pickle of ", n_, " bytes"));
    }
    if (kind == 'n' || kind == 'N') line();
    if (kind == 'N') line();
  }
  void pop(size_t k) {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (depth_ - floor < k) bad(str_cat("an opcode takes ", k, " stack items of ", depth_ - floor));
    depth_ -= k;
  }
  void stack(const Opcode& op) {
    if (op.take == kMark) {
      marks_.push_back(depth_);
      return;
    }
    if (op.take == kToMark || op.take == kToMarkAndOne) {
      if (marks_.empty()) bad("an opcode takes the items above a mark, and there is none");
      depth_ = marks_.back();
      marks_.pop_back();
      if (op.take == kToMarkAndOne) pop(1);
    } else {
      pop(static_cast<size_t>(op.take));
    }
    depth_ += static_cast<size_t>(op.give);
  }

  const char* p_;
  size_t n_, at_ = 0, depth_ = 0;
  std::vector<size_t> marks_;  // the stack's depth at each open mark
  const std::string& path_;
};

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
  PickleWalk(static_cast<const char*>(pickle.get()), pickle_size, path).run();
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
