#include "core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

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

void check_writable_dir(const std::string& dir, const std::string& what) {
  const fs::path target = dir.empty() ? fs::path(".") : fs::path(dir);
  std::error_code ec;
  // The deepest part of the path that exists; every level below it is created and later removed.
  std::vector<fs::path> missing;
  fs::path existing = target;
  while (!existing.empty() && !fs::exists(existing, ec)) {
    missing.push_back(existing);
    existing = existing.parent_path();
  }
  if (existing.empty()) existing = ".";
  if (!fs::is_directory(existing, ec))
    throw InvalidArgument(str_cat(what, ": cannot write to '", dir, "': '", existing.string(),
                                  "' is not a directory"));
  std::string why;
  std::vector<fs::path> created;
  for (auto it = missing.rbegin(); it != missing.rend() && why.empty(); ++it) {
    if (::mkdir(it->c_str(), 0755) == 0)
      created.push_back(*it);
    else if (errno != EEXIST)  // another process's run may be creating it too
      why = str_cat("cannot create '", it->string(), "': ", std::strerror(errno));
  }
  if (why.empty()) {
    std::string probe = (target / ".krab-probe-XXXXXX").string();
    const int fd = ::mkstemp(probe.data());
    if (fd < 0) {
      why = std::strerror(errno);
    } else {
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  for (auto it = created.rbegin(); it != created.rend(); ++it) ::rmdir(it->c_str());
  if (!why.empty()) throw InvalidArgument(str_cat(what, ": cannot write to '", dir, "': ", why));
}

void check_writable_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw InvalidArgument(str_cat(what, ": '", path, "' is a directory, not a file name"));
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw InvalidArgument(str_cat(what, ": directory '", parent.string(), "' does not exist"));
  check_writable_dir(parent.string(), what);
}

std::string dump_json(const nlohmann::json& json) {
  return json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(str_cat("cannot read '", path, "': ", std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace krab::core
