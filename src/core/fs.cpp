#include "core/fs.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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
  // Level by level rather than std::filesystem::create_directories, which asks for 0777.
  fs::path level;
  for (const fs::path& part : fs::path(path)) {
    level /= part;
    if (part.empty() || part == "." || part == "/") continue;  // "runs/" ends in an empty part
    std::error_code ec;
    // An existing level is taken as it is (a symlink to a directory too), and before mkdir, which
    // may fail for other reasons on a level that exists (a read-only mount, say).
    if (fs::is_directory(level, ec) || ::mkdir(level.c_str(), 0700) == 0) continue;
    const int err = errno;
    if (err == EEXIST && fs::is_directory(level, ec)) continue;  // another process made it
    throw Error(str_cat("cannot create directory '", path, "': ",
                        err == EEXIST ? str_cat("'", level.string(), "' is not a directory")
                                      : std::string(std::strerror(err))));
  }
}

namespace {

// Creates the temporary beside `path` for write_file_atomic. The old name, PATH.tmp.<pid>, could
// be guessed: a symlink planted under every pid made krab write through it into the symlink's
// target (O_CREAT without O_EXCL follows one). A random name is never there already, and should
// it be (a clash, or a planted name), O_EXCL fails instead of opening it. The kernel applies the
// umask to `mode`, so umask can only take bits away; no chmod is needed afterwards since the
// file is new.
int create_temporary(const std::string& path, mode_t mode, std::string& tmp) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    uint64_t bits = 0;
    if (::getrandom(&bits, sizeof(bits), 0) != static_cast<ssize_t>(sizeof(bits)))
      throw Error(str_cat("cannot write '", path, "': getrandom: ", std::strerror(errno)));
    char suffix[17];
    std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(bits));
    tmp = str_cat(path, ".tmp.", suffix);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) return fd;
    if (errno != EEXIST) break;
  }
  throw Error(str_cat("cannot write '", tmp, "': ", std::strerror(errno)));
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::string& path, FileAccess access) : path_(path) {
  const fs::path target(path);
  dir_ = target.parent_path().empty() ? "." : target.parent_path().string();
  make_dirs(dir_);
  fd_ = create_temporary(path, access == FileAccess::kPrivate ? 0600 : 0644, tmp_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) abandon();
}

void AtomicFileWriter::abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

void AtomicFileWriter::write(const char* data, size_t n) {
  KRAB_CHECK(fd_ >= 0 && !committed_, "AtomicFileWriter for '", path_, "' is closed");
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::write(fd_, data + done, n - done);
    if (k < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      abandon();
      throw Error(str_cat("cannot write '", path_, "': ", why));
    }
    done += static_cast<size_t>(k);
  }
}

void AtomicFileWriter::commit() {
  KRAB_CHECK(fd_ >= 0 && !committed_, "AtomicFileWriter for '", path_, "' is closed");
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    abandon();
    throw Error(str_cat("cannot flush '", path_, "': ", why));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    const std::string tmp = tmp_;
    abandon();
    throw Error(str_cat("cannot rename '", tmp, "' to '", path_, "': ", why));
  }
  committed_ = true;
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& data, FileAccess access) {
  AtomicFileWriter out(path, access);
  out.write(data);
  out.commit();
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
    if (::mkdir(it->c_str(), 0700) == 0)
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
    throw InvalidArgument(
        fs::exists(parent, ec)
            ? str_cat(what, ": '", parent.string(), "' is a file, not a directory (in '", path,
                      "')")
            : str_cat(what, ": directory '", parent.string(), "' does not exist"));
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
