// ByteSource: random access to the bytes of a file krab reads without holding it (a shard of a
// sharded checkpoint, state.krab through the checkpoint reader): the counterpart of ByteSink.
// core::FileSource (core/fs.h) reads a file with pread; MemorySource a buffer someone else owns
// (a record already in memory, the fuzz targets).
//
// size() is fixed when the source is made (a file's size when it was opened). read() fills all
// `n` bytes or throws: CorruptData naming the source where fewer are there (a file that shrank
// since it was opened), krab::Error for an I/O error. A caller checks its ranges against size()
// first; a range past it is the caller's bug, also refused. const and thread-safe as long as the
// source is (pread is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/errors.h"

namespace krab::core {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  virtual void read(uint64_t offset, char* dst, size_t n) const = 0;
  // The file (or buffer) in messages.
  virtual const std::string& name() const = 0;
};

// A buffer of `n` bytes at `data`, which must outlive the source.
class MemorySource : public ByteSource {
 public:
  MemorySource(const char* data, size_t n, std::string name)
      : data_(data), n_(n), name_(std::move(name)) {}
  uint64_t size() const override { return n_; }
  void read(uint64_t offset, char* dst, size_t n) const override {
    KRAB_CHECK(offset <= n_ && n <= n_ - offset, "read of ", n, " bytes at ", offset, " outside ",
               name_, "'s ", n_);
    if (n > 0) std::memcpy(dst, data_ + offset, n);
  }
  const std::string& name() const override { return name_; }

 private:
  const char* data_;
  size_t n_;
  std::string name_;
};

}  // namespace krab::core
