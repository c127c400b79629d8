#include "core/archive_walk.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::core {
namespace {

uint64_t le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// The zip walk's failures all read "SOURCE: damaged KIND: why".
struct Damage {
  const std::string& source;
  const std::string& kind;
  [[noreturn]] void operator()(const std::string& why) const {
    throw CorruptData(str_cat(source, ": damaged ", kind, ": ", why));
  }
};

// Where the central directory is, from the end-of-directory records (zip64's when present:
// torch.save always writes one).
std::pair<uint64_t, uint64_t> directory_span(std::istream& in, uint64_t file_size,
                                             const Damage& damaged) {
  const uint64_t tail_size = std::min<uint64_t>(file_size, 22 + 65535 + 20 + 56);
  std::string tail(tail_size, '\0');
  in.seekg(static_cast<std::streamoff>(file_size - tail_size));
  if (!in.read(tail.data(), static_cast<std::streamsize>(tail_size)))
    damaged("cannot read its end");
  const size_t end = tail.rfind(std::string("PK\x05\x06", 4));
  if (end == std::string::npos || tail.size() - end < 22) damaged("no zip directory");
  uint64_t size = le(&tail[end + 12], 4), offset = le(&tail[end + 16], 4);
  if (end >= 20 && tail.compare(end - 20, 4, "PK\x06\x07", 4) == 0) {
    const uint64_t at = le(&tail[end - 20 + 8], 8);  // the zip64 end record's file offset
    const uint64_t tail_start = file_size - tail_size, end_at = tail_start + end;
    if (at < tail_start || at > end_at || end_at - at < 56 ||
        tail.compare(at - tail_start, 4, "PK\x06\x06", 4) != 0)
      damaged("bad zip64 directory record");
    size = le(&tail[at - tail_start + 40], 8);
    offset = le(&tail[at - tail_start + 48], 8);
  }
  if (offset > file_size || size > file_size - offset) damaged("zip directory out of the file");
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

// A directory entry's method and sizes (see check_zip_directory in the header).
void check_record(const std::string& shown, uint64_t method, uint64_t compressed,
                  uint64_t uncompressed, uint64_t local, uint64_t file_size, uint64_t max_inflated,
                  const Damage& damaged) {
  constexpr uint64_t kDeflate = 8, kDeflateMaxRatio = 1032;
  if (method == kDeflate && max_inflated > 0) {
    if (local > file_size || compressed > file_size - local)
      damaged(str_cat("record ", shown, " states ", compressed, " compressed bytes at offset ",
                      local, ", past the end of the file"));
    if (uncompressed > max_inflated || uncompressed / kDeflateMaxRatio > compressed)
      damaged(str_cat("record ", shown, " states ", uncompressed, " bytes inflated from ",
                      compressed, " (at most ", max_inflated, " bytes, ", kDeflateMaxRatio,
                      " per compressed byte)"));
    return;
  }
  if (method != 0)
    damaged(str_cat("record ", shown, " is compressed",
                    max_inflated > 0 ? " by a method other than deflate" : "",
                    " (PyTorch stores records)"));
  if (compressed != uncompressed || local > file_size || uncompressed > file_size - local)
    damaged(str_cat("record ", shown, " states ", uncompressed, " bytes at offset ", local,
                    ", past the end of the file"));
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
constexpr unsigned char kGlobal = 'c', kInst = 'i', kStackGlobal = 0x93;
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

// The pickle walked without being run (see check_pickle in the header). LibTorch's unpickler
// takes stack items with back() and end() - 2, unchecked: a fuzzed BUILD on a one-item stack
// read freed memory, hence the stack bookkeeping here.
class PickleWalk {
 public:
  PickleWalk(const char* p, size_t n, const std::string& source, const std::string& record,
             const std::function<void(const PickleGlobal&)>& on_global)
      : p_(p), n_(n), source_(source), record_(record), on_global_(on_global) {}

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
      const size_t argument_at = at_;
      argument(op->argument);
      stack(*op);
      if (on_global_ && (code == kGlobal || code == kInst)) on_global_(global(argument_at));
      if (on_global_ && code == kStackGlobal) on_global_(PickleGlobal{"", "", true});
      if (code == '.') return;
    }
    bad("no STOP opcode");
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    throw CorruptData(
        str_cat(source_, ": damaged pickle (", record_, ") at byte ", at_, ": ", why));
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
  // The two lines of a GLOBAL or INST argument that starts at `from` (argument() checked them).
  PickleGlobal global(size_t from) const {
    const std::string_view text(p_ + from, at_ - from);
    const size_t nl = text.find('\n');
    return {std::string(text.substr(0, nl)), std::string(text.substr(nl + 1, text.size() - nl - 2)),
            false};
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
  const std::string& source_;
  const std::string& record_;
  const std::function<void(const PickleGlobal&)>& on_global_;
};

}  // namespace

ArchiveRecords check_zip_directory(std::istream& in, uint64_t file_size, const std::string& source,
                                   const std::string& kind, uint64_t max_inflated,
                                   std::set<std::string>* stored) {
  const Damage damaged{source, kind};
  const auto [offset, size] = directory_span(in, file_size, damaged);
  std::string dir(size, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(dir.data(), static_cast<std::streamsize>(size))) damaged("short directory");
  ArchiveRecords records;
  for (size_t at = 0; at + 46 <= dir.size();) {
    if (dir.compare(at, 4, "PK\x01\x02", 4) != 0) damaged("bad zip directory entry");
    const uint64_t method = le(&dir[at + 10], 2), name_len = le(&dir[at + 28], 2),
                   extra_len = le(&dir[at + 30], 2), comment_len = le(&dir[at + 32], 2);
    uint64_t compressed = le(&dir[at + 20], 4), uncompressed = le(&dir[at + 24], 4);
    uint64_t local = le(&dir[at + 42], 4);
    if (at + 46 + name_len + extra_len + comment_len > dir.size())
      damaged("zip directory entry out of the directory");
    const std::string name = dir.substr(at + 46, name_len);
    zip64_fields(&dir[at + 46 + name_len], extra_len, &uncompressed, &compressed, &local);
    const std::string shown = printable(name, 60);
    check_record(shown, method, compressed, uncompressed, local, file_size, max_inflated, damaged);
    const size_t slash = name.find('/');
    const std::string key = slash == std::string::npos ? name : name.substr(slash + 1);
    records[key] = uncompressed;
    if (stored != nullptr && method == 0) stored->insert(key);
    at += 46 + name_len + extra_len + comment_len;
  }
  return records;
}

void check_pickle(const char* bytes, size_t size, const std::string& source,
                  const std::string& record,
                  const std::function<void(const PickleGlobal&)>& on_global) {
  PickleWalk(bytes, size, source, record, on_global).run();
}

}  // namespace krab::core
