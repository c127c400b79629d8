#include "core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace krab::core {

namespace fs = std::filesystem;

bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw Error(str_cat("cannot create directory '", path, "': ", ec.message()));
}

void write_file_atomic(const std::string& path, const std::string& data) {
  const fs::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  make_dirs(dir);
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(str_cat("cannot write '", tmp, "': ", std::strerror(errno)));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(str_cat("cannot write '", path, "': ", why));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(str_cat("cannot flush '", path, "': ", why));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(str_cat("cannot rename '", tmp, "' to '", path, "': ", why));
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(str_cat("cannot read '", path, "': ", std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace krab::core
