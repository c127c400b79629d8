#include "core/file_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace krab::core {

FileSource::FileSource(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InvalidArgument(str_cat("cannot read '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd_);
    throw InvalidArgument(str_cat("cannot read '", path,
                                  "': ", S_ISREG(st.st_mode) ? std::strerror(err) : "not a file"));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

FileSource::~FileSource() {
  if (fd_ >= 0) ::close(fd_);
}

void FileSource::read(uint64_t offset, char* dst, size_t n) const {
  KRAB_CHECK(offset <= size_ && n <= size_ - offset, "read of ", n, " bytes at ", offset,
             " outside '", path_, "' (", size_, " bytes)");
  while (n > 0) {
    const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(str_cat("cannot read '", path_, "': ", std::strerror(errno)));
    // The size was taken at open: a file that ends earlier now was cut while krab read it.
    if (got == 0)
      throw CorruptData(str_cat("'", path_, "' is shorter than when it was opened (", size_,
                                " bytes): it was truncated while being read"));
    dst += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

}  // namespace krab::core
