// Records: krab's data-only container for its own state files (checkpoints, fl-state.krab).
//
// A record is an ordered list of named entries; each entry is one of
//   - a dense tensor (a dtype from a short allowlist, rank <= kMaxRank, row-major bytes),
//   - an int64, a double, or a string (at most kMaxStringBytes).
// Nothing in a record is code, and nothing in it is handed to a LibTorch parser: the reader
// walks the bytes itself, the way data/tensor_file.cpp walks a torch.save archive, and builds
// each tensor with at::empty + memcpy once its size has been checked against the bytes that are
// there. A forged file can therefore at worst be refused, never run, and it cannot make the
// reader allocate more than the file's own size (plus the map of entries).
//
// Byte layout (all integers little-endian):
//   "KREC" | u32 entry count
//   entry: u16 name length | name | u8 kind
//     kind 1 tensor: u8 dtype | u8 rank | rank x i64 size | u64 byte count | bytes
//     kind 2 int64:  8 bytes
//     kind 3 double: 8 bytes (IEEE 754 binary64)
//     kind 4 string: u64 length | bytes
// The framing around a record (magic, version, length, CRC, seal) belongs to the file that holds
// it (train/checkpoint.h, federated/server_state.h).
//
// What parse() checks, each failure a CorruptData naming the source and what is wrong:
// names of 1..kMaxNameBytes printable ASCII bytes, unique; a known kind and dtype; rank <=
// kMaxRank; sizes >= 0 whose product, times the element size, neither overflows nor differs
// from the stated byte count; every byte inside the buffer; bool tensors hold only 0 and 1; no
// bytes after the last entry.
//
// Readers: Record::parse reads a record in memory whole (small files: manifests, fl-state.krab,
// the stage-0 resume); RecordIndex walks a record in a file (a ByteSource) and keeps where each
// entry is, so that a reader takes one entry, or a range of one tensor, with pread: restoring a
// rank's slice of a multi-GB shard reads that slice and the entry headers, never the file. Both
// are the one walk and make the same checks; RecordIndex defers the one check that needs a
// tensor's bytes (bool values) to the read of that tensor.
//
// Writers: RecordWriter builds the whole record in memory (small files: manifests,
// fl-state.krab); RecordStreamWriter takes its entries first and then streams the record to a
// ByteSink without holding it (state.krab, multi-GB shard files). Both produce the same bytes for
// the same entries, and both are RecordEntries, so code that lists entries
// (train/optimizer_state.h) writes to either.
//
// Thread safety: a writer is used by one thread at a time; a Record is immutable once parsed
// and may be read from several threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/byte_sink.h"
#include "core/byte_source.h"

namespace krab::core {

constexpr size_t kMaxNameBytes = 256;
constexpr int kMaxRank = 8;
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;

// A record's entries as a writer takes them. Names must be unique and valid (see above);
// add() of a bad name, a repeated name, or a tensor of a dtype outside the allowlist is a bug in
// the caller and throws Error.
class RecordEntries {
 public:
  virtual ~RecordEntries() = default;
  virtual void add_tensor(const std::string& name, const at::Tensor& tensor) = 0;
  virtual void add_int(const std::string& name, int64_t value) = 0;
  virtual void add_double(const std::string& name, double value) = 0;
  virtual void add_string(const std::string& name, const std::string& value) = 0;
};

// Builds a record's bytes in memory, entry by entry.
class RecordWriter : public RecordEntries {
 public:
  // Copies the tensor's values (detached, made contiguous, on the CPU) now.
  void add_tensor(const std::string& name, const at::Tensor& tensor) override;
  void add_int(const std::string& name, int64_t value) override;
  void add_double(const std::string& name, double value) override;
  void add_string(const std::string& name, const std::string& value) override;

  // The record so far.
  std::string bytes() const;

 private:
  std::string body_;
  std::vector<std::string> names_;
};

// Streams a record: the entries are declared first (so that the entry count and the total
// size are known before the first byte, as a frame with a length header needs), then write()
// sends header and bytes of each entry straight from the tensor's memory to the sink.
// add_tensor() keeps a handle to the tensor, not a copy: its values must not change until
// write() returns (the caller holds the model or optimizer still meanwhile). A tensor that is
// not contiguous is made contiguous one entry at a time during write(); memory beyond the
// tensors themselves is the entry headers.
class RecordStreamWriter : public RecordEntries {
 public:
  void add_tensor(const std::string& name, const at::Tensor& tensor) override;
  void add_int(const std::string& name, int64_t value) override;
  void add_double(const std::string& name, double value) override;
  void add_string(const std::string& name, const std::string& value) override;

  // The number of bytes write() sends.
  uint64_t size() const { return size_; }
  // Sends the record; may be called more than once (each call sends the same bytes if the
  // tensors did not change). Throws what the sink throws.
  void write(ByteSink& out) const;

 private:
  struct Entry {
    std::string head;   // name, kind and the scalar value or the tensor's header
    at::Tensor tensor;  // undefined for a scalar entry
  };
  std::vector<Entry> entries_;
  std::vector<std::string> names_;
  uint64_t size_ = 8;  // magic + entry count
};

class RecordIndex;

// A parsed, fully checked record. Accessors throw CorruptData naming the source when an entry is
// missing or of another kind: a file that passed its CRC was still not necessarily written by
// this krab.
class Record {
 public:
  // Walks and checks `n` bytes at `data` (see the list above); `source` names the file in
  // messages. The tensors are copied out, so `data` need not outlive the Record.
  static Record parse(const char* data, size_t n, const std::string& source);

  bool has(const std::string& name) const;
  // The tensor `name`, any allowed dtype and shape: the caller checks what it expects.
  const at::Tensor& tensor(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  const std::string& text(const std::string& name) const;
  // Entry names in file order.
  const std::vector<std::string>& names() const { return order_; }
  const std::string& source() const { return source_; }

 private:
  friend class RecordIndex;
  using Value = std::variant<at::Tensor, int64_t, double, std::string>;
  const Value& find(const std::string& name, size_t kind, const char* what) const;

  std::string source_;
  std::vector<std::string> order_;
  std::map<std::string, Value> entries_;
};

// A record in a file, walked and checked once (every check of Record::parse but the bool
// values, which tensor() and read() check) and then read entry by entry in place. Memory: the
// entry headers (name, kind, sizes, offset), never the values. The source must stay unchanged
// while the index is used: the caller verifies the file's digest first (train/shard_file.h) and
// keeps the source open. Accessors throw CorruptData naming the source for a missing entry or
// one of another kind, as Record's do. Immutable once built; reads are as thread-safe as the
// source's.
class RecordIndex {
 public:
  enum class Kind : uint8_t { kTensor = 1, kInt = 2, kDouble = 3, kString = 4 };

  // Walks the `length` bytes at `offset` in `src` (CorruptData naming `source` and the entry,
  // in Record::parse's words). Reads the headers through a window of 64 KiB; skips tensor
  // and string bytes.
  RecordIndex(std::shared_ptr<const ByteSource> src, uint64_t offset, uint64_t length,
              std::string source);

  bool has(const std::string& name) const;
  // Entry names in file order.
  const std::vector<std::string>& names() const { return order_; }
  const std::string& source() const { return source_; }

  // A tensor entry's dtype and sizes, from its header alone.
  at::ScalarType dtype(const std::string& name) const;
  const std::vector<int64_t>& sizes(const std::string& name) const;
  // The whole tensor (its bytes read now).
  at::Tensor tensor(const std::string& name) const;
  // Elements [first, first + count) (row-major) of tensor `name` into `dst`, which holds
  // count * element size bytes. A range outside the tensor is the caller's bug (Error).
  void read(const std::string& name, int64_t first, int64_t count, void* dst) const;
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  std::string text(const std::string& name) const;

  // The entries `keep(name, kind)` selects, read into a Record (e.g. every scalar, or the
  // buffers): what a reader wants whole.
  Record load(const std::function<bool(const std::string&, Kind)>& keep) const;

 private:
  struct Entry {
    Kind kind;
    at::ScalarType dtype = at::kByte;  // tensor
    std::vector<int64_t> sizes;        // tensor
    uint64_t offset = 0, bytes = 0;    // tensor values / string bytes, absolute in the source
    int64_t integer = 0;
    double real = 0;
  };
  friend class RecordWalk;
  const Entry& find(const std::string& name, Kind kind) const;

  std::shared_ptr<const ByteSource> src_;
  std::string source_;
  std::vector<std::string> order_;
  std::map<std::string, Entry> entries_;
};

}  // namespace krab::core
