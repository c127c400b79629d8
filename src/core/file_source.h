// FileSource: a file read in place with pread (core/byte_source.h), never whole: the
// checkpoint reader's shards and state.krab (train/shard_file.h, train/checkpoint.h).
//
// Opened read-only at construction and held open until destroyed, so size() is the size it had
// then (fstat) and a file renamed over the path meanwhile is not the one read. A missing or
// unreadable path, or one that is not a regular file: InvalidArgument naming it, as
// core::read_file(). A read past what is there now (the file shrank since): CorruptData naming
// the path. Reads are thread-safe (pread).
#pragma once

#include <string>

#include "core/byte_source.h"

namespace krab::core {

class FileSource : public ByteSource {
 public:
  explicit FileSource(const std::string& path);
  ~FileSource() override;
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, char* dst, size_t n) const override;
  const std::string& name() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace krab::core
