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

// The walk over untrusted bytes: every read is checked against what remains, and every
// failure names the source and the entry being read.
class Reader {
 public:
  Reader(const char* p, size_t n, const std::string& source) : p_(p), n_(n), source_(source) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw CorruptData(str_cat(source_, ": not a valid krab record: ",
                              entry_.empty() ? "" : str_cat("entry '", entry_, "': "), why));
  }
  void need(uint64_t bytes, const char* what) const {
    if (bytes > n_ - at_)
      fail(str_cat(what, " needs ", bytes, " bytes at offset ", at_, ", only ", n_ - at_,
                   " remain"));
  }
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  const char* take(uint64_t bytes, const char* what) {
    need(bytes, what);
    const char* at = p_ + at_;
    at_ += bytes;
    return at;
  }
  bool done() const { return at_ == n_; }
  void set_entry(std::string name) { entry_ = std::move(name); }

 private:
  const char* p_;
  size_t n_, at_ = 0;
  const std::string& source_;
  std::string entry_;
};

at::Tensor read_tensor(Reader& in) {
  const Dtype* dtype = dtype_by_code(in.get<uint8_t>("dtype"));
  if (dtype == nullptr) in.fail("unknown dtype code");
  const uint8_t rank = in.get<uint8_t>("rank");
  if (rank > kMaxRank) in.fail(str_cat("rank ", int{rank}, " is above ", kMaxRank));
  std::vector<int64_t> sizes(rank);
  for (auto& s : sizes) {
    s = in.get<int64_t>("size");
    if (s < 0 || s > kMaxDim) in.fail(str_cat("size ", s, " is out of range"));
  }
  // The byte count the sizes imply, refused where it would overflow. A zero size makes the
  // tensor empty, but the other sizes must still multiply without overflow: at::empty multiplies
  // every size on its way and throws its own error where that overflows ([2^48, 2^48, 0]).
  const uint64_t elem = at::elementSize(dtype->type);
  const uint64_t limit = std::numeric_limits<uint64_t>::max() / elem;
  uint64_t span = 1;
  for (const int64_t s : sizes) {
    if (s == 0) continue;
    if (span > limit / static_cast<uint64_t>(s)) in.fail("its sizes overflow a byte count");
    span *= static_cast<uint64_t>(s);
  }
  const bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
  const uint64_t numel = empty ? 0 : span;
  const uint64_t bytes = in.get<uint64_t>("byte count");
  if (bytes != numel * elem)
    in.fail(str_cat("states ", bytes, " bytes for ", numel, " ", dtype->name, " elements"));
  const char* data = in.take(bytes, "tensor data");
  if (dtype->type == at::kBool &&
      std::any_of(data, data + bytes, [](char c) { return c != 0 && c != 1; }))
    in.fail("a bool tensor holds a byte other than 0 and 1");
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype->type));
  if (bytes > 0) std::memcpy(t.data_ptr(), data, bytes);
  return t;
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

Record Record::parse(const char* data, size_t n, const std::string& source) {
  Record r;
  r.source_ = source;
  Reader in(data, n, source);
  if (std::memcmp(in.take(sizeof(kMagic), "the magic"), kMagic, sizeof(kMagic)) != 0)
    in.fail("bad magic");
  const uint32_t count = in.get<uint32_t>("the entry count");
  for (uint32_t i = 0; i < count; ++i) {
    in.set_entry("");
    const uint16_t len = in.get<uint16_t>("a name length");
    std::string name(in.take(len, "a name"), len);
    if (!valid_name(name))
      in.fail(str_cat("entry #", i, " has a bad name '", printable(name), "'"));
    if (r.entries_.count(name) != 0) in.fail(str_cat("entry '", name, "' appears twice"));
    in.set_entry(name);
    Value v;
    switch (in.get<uint8_t>("the kind")) {
      case kTensor:
        v = read_tensor(in);
        break;
      case kInt:
        v = in.get<int64_t>("the integer");
        break;
      case kDouble:
        v = in.get<double>("the double");
        break;
      case kString: {
        const uint64_t bytes = in.get<uint64_t>("the string length");
        if (bytes > kMaxStringBytes) in.fail(str_cat("a string of ", bytes, " bytes"));
        v = std::string(in.take(bytes, "the string"), bytes);
        break;
      }
      default:
        in.fail("unknown kind");
    }
    r.order_.push_back(name);
    r.entries_.emplace(std::move(name), std::move(v));
  }
  in.set_entry("");
  if (!in.done()) in.fail("bytes after the last entry");
  return r;
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

}  // namespace krab::core
