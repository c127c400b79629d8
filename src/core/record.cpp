#include "core/record.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "core/errors.h"
#include "core/le_bytes.h"
#include "core/printable.h"

namespace krab::core {
namespace {

constexpr char kMagic[4] = {'K', 'R', 'E', 'C'};
enum Kind : uint8_t { kTensor = 1, kInt = 2, kDouble = 3, kString = 4 };
constexpr const char* kKindNames[] = {"?", "a tensor", "an integer", "a double", "a string"};
// The largest size one dimension may state: far above any real tensor.
constexpr int64_t kMaxDim = int64_t{1} << 48;

// The dtypes a record holds, with their codes on disk. Codes are krab's own, not LibTorch's
// ScalarType numbers, so a LibTorch upgrade cannot change what a file means.
struct Dtype {
  uint8_t code;
  at::ScalarType type;
  const char* name;
};
constexpr Dtype kDtypes[] = {
    {1, at::kFloat, "float32"},     {2, at::kDouble, "float64"}, {3, at::kHalf, "float16"},
    {4, at::kBFloat16, "bfloat16"}, {5, at::kLong, "int64"},     {6, at::kInt, "int32"},
    {7, at::kShort, "int16"},       {8, at::kChar, "int8"},      {9, at::kByte, "uint8"},
    {10, at::kBool, "bool"},
};

const Dtype* dtype_by_code(uint8_t code) {
  for (const Dtype& d : kDtypes)
    if (d.code == code) return &d;
  return nullptr;
}

const Dtype* dtype_by_type(at::ScalarType type) {
  for (const Dtype& d : kDtypes)
    if (d.type == type) return &d;
  return nullptr;
}

bool valid_name(const std::string& name) {
  return !name.empty() && name.size() <= kMaxNameBytes &&
         std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

template <typename T>
void put(std::string& out, T v) {
  put_le(out, v);  // krab only builds for little-endian hosts (core/le_bytes.h)
}

// --- Entry encoding, shared by both writers --------------------------------------------------

// Checks `name` against the entries in `names` and starts its entry in `out`.
void begin_entry(std::string& out, std::vector<std::string>& names, const std::string& name,
                 uint8_t kind) {
  KRAB_CHECK(valid_name(name), "record entry name '", printable(name), "' is not valid");
  KRAB_CHECK(std::find(names.begin(), names.end(), name) == names.end(), "record entry '", name,
             "' written twice");
  names.push_back(name);
  put<uint16_t>(out, static_cast<uint16_t>(name.size()));
  out += name;
  put<uint8_t>(out, kind);
}

// The tensor `name` as it will be written: detached, on the CPU, contiguous.
at::Tensor storable(const std::string& name, const at::Tensor& tensor) {
  KRAB_CHECK(tensor.defined(), "record entry '", name, "': undefined tensor");
  KRAB_CHECK(dtype_by_type(tensor.scalar_type()) != nullptr && tensor.dim() <= kMaxRank,
             "record entry '", name, "': a tensor of ", tensor.scalar_type(), " and rank ",
             tensor.dim(), " cannot be stored");
  return tensor.detach().to(at::kCPU);
}

// A tensor entry up to its byte count (the bytes follow); returns the byte count.
uint64_t tensor_head(std::string& out, const at::Tensor& t) {
  put<uint8_t>(out, dtype_by_type(t.scalar_type())->code);
  put<uint8_t>(out, static_cast<uint8_t>(t.dim()));
  for (const int64_t s : t.sizes()) put<int64_t>(out, s);
  const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  put<uint64_t>(out, bytes);
  return bytes;
}

void string_value(std::string& out, const std::string& name, const std::string& value) {
  KRAB_CHECK(value.size() <= kMaxStringBytes, "record entry '", name, "': string of ", value.size(),
             " bytes");
  put<uint64_t>(out, value.size());
  out += value;
}

std::string record_head(uint32_t count) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, count);
  return out;
}

}  // namespace

void RecordWriter::add_tensor(const std::string& name, const at::Tensor& tensor) {
  const at::Tensor t = storable(name, tensor).contiguous();
  begin_entry(body_, names_, name, kTensor);
  const uint64_t bytes = tensor_head(body_, t);
  if (bytes > 0) body_.append(static_cast<const char*>(t.data_ptr()), bytes);
}

void RecordWriter::add_int(const std::string& name, int64_t value) {
  begin_entry(body_, names_, name, kInt);
  put<int64_t>(body_, value);
}

void RecordWriter::add_double(const std::string& name, double value) {
  begin_entry(body_, names_, name, kDouble);
  put<double>(body_, value);
}

void RecordWriter::add_string(const std::string& name, const std::string& value) {
  std::string head;
  string_value(head, name, value);  // checks the length before the entry is counted
  begin_entry(body_, names_, name, kString);
  body_ += head;
}

void RecordStreamWriter::add_tensor(const std::string& name, const at::Tensor& tensor) {
  Entry e;
  e.tensor = storable(name, tensor);
  begin_entry(e.head, names_, name, kTensor);
  const uint64_t bytes = tensor_head(e.head, e.tensor);
  size_ += e.head.size() + bytes;
  entries_.push_back(std::move(e));
}

void RecordStreamWriter::add_int(const std::string& name, int64_t value) {
  Entry e;
  begin_entry(e.head, names_, name, kInt);
  put<int64_t>(e.head, value);
  size_ += e.head.size();
  entries_.push_back(std::move(e));
}

void RecordStreamWriter::add_double(const std::string& name, double value) {
  Entry e;
  begin_entry(e.head, names_, name, kDouble);
  put<double>(e.head, value);
  size_ += e.head.size();
  entries_.push_back(std::move(e));
}

void RecordStreamWriter::add_string(const std::string& name, const std::string& value) {
  std::string tail;
  string_value(tail, name, value);
  Entry e;
  begin_entry(e.head, names_, name, kString);
  e.head += tail;
  size_ += e.head.size();
  entries_.push_back(std::move(e));
}

void RecordStreamWriter::write(ByteSink& out) const {
  out.write(record_head(static_cast<uint32_t>(entries_.size())));
  for (const Entry& e : entries_) {
    out.write(e.head);
    if (!e.tensor.defined() || e.tensor.numel() == 0) continue;
    // One entry at a time: a view that is not contiguous is copied alone, never the record.
    const at::Tensor t = e.tensor.contiguous();
    out.write(static_cast<const char*>(t.data_ptr()),
              static_cast<size_t>(t.numel()) * t.element_size());
  }
}

std::string RecordWriter::bytes() const {
  return record_head(static_cast<uint32_t>(names_.size())) + body_;
}

bool Record::has(const std::string& name) const { return entries_.count(name) != 0; }

const Record::Value& Record::find(const std::string& name, size_t kind, const char* what) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw CorruptData(str_cat(source_, ": entry '", name, "' is missing"));
  if (it->second.index() != kind)
    throw CorruptData(str_cat(source_, ": entry '", name, "' is ",
                              kKindNames[it->second.index() + 1], ", not ", what));
  return it->second;
}

const at::Tensor& Record::tensor(const std::string& name) const {
  return std::get<at::Tensor>(find(name, 0, "a tensor"));
}
int64_t Record::integer(const std::string& name) const {
  return std::get<int64_t>(find(name, 1, "an integer"));
}
double Record::real(const std::string& name) const {
  return std::get<double>(find(name, 2, "a double"));
}
const std::string& Record::text(const std::string& name) const {
  return std::get<std::string>(find(name, 3, "a string"));
}

// --- Reading: one walk for Record::parse and RecordIndex ----------------------------------------

namespace {

[[noreturn]] void fail_entry(const std::string& source, const std::string& entry,
                             const std::string& why) {
  throw CorruptData(str_cat(source, ": not a valid krab record: ",
                            entry.empty() ? "" : str_cat("entry '", entry, "': "), why));
}

void check_bools(const char* data, uint64_t n, const std::string& source,
                 const std::string& entry) {
  if (std::any_of(data, data + n, [](char c) { return c != 0 && c != 1; }))
    fail_entry(source, entry, "a bool tensor holds a byte other than 0 and 1");
}

constexpr uint64_t kWindowBytes = 64 << 10;

}  // namespace

// The walk over untrusted bytes: every read is checked against what remains, and every
// failure names the source and the entry being read. Headers come through a window, so a
// record in a file costs a few reads of 64 KiB however large its tensors are; values and
// strings are skipped, their place kept.
class RecordWalk {
 public:
  RecordWalk(const ByteSource& src, uint64_t base, uint64_t n, const std::string& source)
      : src_(src), base_(base), n_(n), source_(source) {}

  void run(RecordIndex& index) {
    if (std::memcmp(take(sizeof(kMagic), "the magic").data(), kMagic, sizeof(kMagic)) != 0)
      fail("bad magic");
    const uint32_t count = get<uint32_t>("the entry count");
    for (uint32_t i = 0; i < count; ++i) {
      entry_.clear();
      const uint16_t len = get<uint16_t>("a name length");
      std::string name = take(len, "a name");
      if (!valid_name(name)) fail(str_cat("entry #", i, " has a bad name '", printable(name), "'"));
      if (index.entries_.count(name) != 0) fail(str_cat("entry '", name, "' appears twice"));
      entry_ = name;
      index.order_.push_back(name);
      index.entries_.emplace(std::move(name), read_entry());
    }
    entry_.clear();
    if (at_ != n_) fail("bytes after the last entry");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { fail_entry(source_, entry_, why); }
  void need(uint64_t bytes, const char* what) const {
    if (bytes > n_ - at_)
      fail(str_cat(what, " needs ", bytes, " bytes at offset ", at_, ", only ", n_ - at_,
                   " remain"));
  }
  // Copies `n` bytes at the cursor out of the window, refilling it as needed.
  void fetch(char* dst, uint64_t n) {
    while (n > 0) {
      if (at_ < window_at_ || at_ >= window_at_ + window_.size()) {
        window_at_ = at_;
        window_.resize(std::min<uint64_t>(kWindowBytes, n_ - at_));
        src_.read(base_ + at_, window_.data(), window_.size());
      }
      const uint64_t off = at_ - window_at_, k = std::min<uint64_t>(n, window_.size() - off);
      std::memcpy(dst, window_.data() + off, k);
      dst += k;
      at_ += k;
      n -= k;
    }
  }
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    fetch(reinterpret_cast<char*>(&v), sizeof(T));
    return v;
  }
  std::string take(uint64_t bytes, const char* what) {
    need(bytes, what);
    std::string out(bytes, '\0');
    fetch(out.data(), bytes);
    return out;
  }
  // Skips `bytes` (checked to be there); returns where they start in the source.
  uint64_t skip(uint64_t bytes, const char* what) {
    need(bytes, what);
    const uint64_t at = base_ + at_;
    at_ += bytes;
    return at;
  }

  RecordIndex::Entry read_entry() {
    RecordIndex::Entry e;
    e.kind = static_cast<RecordIndex::Kind>(get<uint8_t>("the kind"));
    switch (e.kind) {
      case RecordIndex::Kind::kTensor:
        read_tensor_head(e);
        e.offset = skip(e.bytes, "tensor data");
        break;
      case RecordIndex::Kind::kInt:
        e.integer = get<int64_t>("the integer");
        break;
      case RecordIndex::Kind::kDouble:
        e.real = get<double>("the double");
        break;
      case RecordIndex::Kind::kString:
        e.bytes = get<uint64_t>("the string length");
        if (e.bytes > kMaxStringBytes) fail(str_cat("a string of ", e.bytes, " bytes"));
        e.offset = skip(e.bytes, "the string");
        break;
      default:
        fail("unknown kind");
    }
    return e;
  }

  void read_tensor_head(RecordIndex::Entry& e) {
    const Dtype* dtype = dtype_by_code(get<uint8_t>("dtype"));
    if (dtype == nullptr) fail("unknown dtype code");
    e.dtype = dtype->type;
    const uint8_t rank = get<uint8_t>("rank");
    if (rank > kMaxRank) fail(str_cat("rank ", int{rank}, " is above ", kMaxRank));
    e.sizes.resize(rank);
    for (auto& s : e.sizes) {
      s = get<int64_t>("size");
      if (s < 0 || s > kMaxDim) fail(str_cat("size ", s, " is out of range"));
    }
    // The byte count the sizes imply, refused where it would overflow. A zero size makes the
    // tensor empty, but the other sizes must still multiply without overflow: at::empty
    // multiplies every size on its way and throws its own error where that overflows
    // ([2^48, 2^48, 0]).
    const uint64_t elem = at::elementSize(dtype->type);
    const uint64_t limit = std::numeric_limits<uint64_t>::max() / elem;
    uint64_t span = 1;
    for (const int64_t s : e.sizes) {
      if (s == 0) continue;
      if (span > limit / static_cast<uint64_t>(s)) fail("its sizes overflow a byte count");
      span *= static_cast<uint64_t>(s);
    }
    const bool empty = std::find(e.sizes.begin(), e.sizes.end(), 0) != e.sizes.end();
    const uint64_t numel = empty ? 0 : span;
    e.bytes = get<uint64_t>("byte count");
    if (e.bytes != numel * elem)
      fail(str_cat("states ", e.bytes, " bytes for ", numel, " ", dtype->name, " elements"));
  }

  const ByteSource& src_;
  const uint64_t base_, n_;
  const std::string& source_;
  uint64_t at_ = 0;
  std::string entry_;
  std::string window_;
  uint64_t window_at_ = 0;
};

RecordIndex::RecordIndex(std::shared_ptr<const ByteSource> src, uint64_t offset, uint64_t length,
                         std::string source)
    : src_(std::move(src)), source_(std::move(source)) {
  KRAB_CHECK(offset <= src_->size() && length <= src_->size() - offset, "record of ", length,
             " bytes at ", offset, " outside ", source_);
  RecordWalk(*src_, offset, length, source_).run(*this);
}

bool RecordIndex::has(const std::string& name) const { return entries_.count(name) != 0; }

const RecordIndex::Entry& RecordIndex::find(const std::string& name, Kind kind) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw CorruptData(str_cat(source_, ": entry '", name, "' is missing"));
  if (it->second.kind != kind)
    throw CorruptData(str_cat(source_, ": entry '", name, "' is ",
                              kKindNames[static_cast<int>(it->second.kind)], ", not ",
                              kKindNames[static_cast<int>(kind)]));
  return it->second;
}

at::ScalarType RecordIndex::dtype(const std::string& name) const {
  return find(name, Kind::kTensor).dtype;
}

const std::vector<int64_t>& RecordIndex::sizes(const std::string& name) const {
  return find(name, Kind::kTensor).sizes;
}

at::Tensor RecordIndex::tensor(const std::string& name) const {
  const Entry& e = find(name, Kind::kTensor);
  at::Tensor t = at::empty(e.sizes, at::TensorOptions().dtype(e.dtype));
  if (e.bytes == 0) return t;
  src_->read(e.offset, static_cast<char*>(t.data_ptr()), e.bytes);
  if (e.dtype == at::kBool)
    check_bools(static_cast<const char*>(t.data_ptr()), e.bytes, source_, name);
  return t;
}

void RecordIndex::read(const std::string& name, int64_t first, int64_t count, void* dst) const {
  const Entry& e = find(name, Kind::kTensor);
  const uint64_t elem = at::elementSize(e.dtype), numel = e.bytes / elem;
  KRAB_CHECK(first >= 0 && count >= 0 && static_cast<uint64_t>(first) <= numel &&
                 static_cast<uint64_t>(count) <= numel - first,
             "read of elements [", first, ", ", first + count, ") of '", name, "' (", numel,
             ") in ", source_);
  if (count == 0) return;
  char* out = static_cast<char*>(dst);
  src_->read(e.offset + first * elem, out, count * elem);
  if (e.dtype == at::kBool) check_bools(out, count * elem, source_, name);
}

int64_t RecordIndex::integer(const std::string& name) const {
  return find(name, Kind::kInt).integer;
}

double RecordIndex::real(const std::string& name) const { return find(name, Kind::kDouble).real; }

std::string RecordIndex::text(const std::string& name) const {
  const Entry& e = find(name, Kind::kString);
  std::string out(e.bytes, '\0');
  src_->read(e.offset, out.data(), e.bytes);
  return out;
}

Record RecordIndex::load(const std::function<bool(const std::string&, Kind)>& keep) const {
  Record r;
  r.source_ = source_;
  for (const std::string& name : order_) {
    const Entry& e = entries_.at(name);
    if (!keep(name, e.kind)) continue;
    Record::Value v;
    switch (e.kind) {
      case Kind::kTensor:
        v = tensor(name);
        break;
      case Kind::kInt:
        v = e.integer;
        break;
      case Kind::kDouble:
        v = e.real;
        break;
      case Kind::kString:
        v = text(name);
        break;
    }
    r.order_.push_back(name);
    r.entries_.emplace(name, std::move(v));
  }
  return r;
}

Record Record::parse(const char* data, size_t n, const std::string& source) {
  // The tensors are copied out of `data` by load(): the Record does not point into it.
  const RecordIndex index(std::make_shared<MemorySource>(data, n, source), 0, n, source);
  return index.load([](const std::string&, RecordIndex::Kind) { return true; });
}

}  // namespace krab::core
