// ByteSink: where a streamed file's bytes go, in order (core/fs.h's AtomicFileWriter, a
// string, a digest that forwards to another sink). Writers that stream (RecordStreamWriter,
// the sharded checkpoint's shard files) write through one, so that no file is ever held whole
// in memory.
//
// write() either takes all `n` bytes or throws krab::Error naming what it writes to; a sink
// that threw is in an unspecified state and is not written to again. Not thread-safe.
#pragma once

#include <cstddef>
#include <string>

namespace krab::core {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const char* data, size_t n) = 0;
  void write(const std::string& bytes) { write(bytes.data(), bytes.size()); }
};

// Appends to a string it does not own (tests, small files built in memory).
class StringSink : public ByteSink {
 public:
  explicit StringSink(std::string& out) : out_(out) {}
  void write(const char* data, size_t n) override { out_.append(data, n); }
  using ByteSink::write;

 private:
  std::string& out_;
};

}  // namespace krab::core
