// Small file-system helpers that keep the "nothing half-written" promise.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/byte_sink.h"

namespace krab::core {

// Who a file krab writes is for. krab asks for the mode below when it creates the file; the
// user's umask can only take bits away (umask 077 makes a shared file private too).
enum class FileAccess {
  kPrivate,  // 0600: checkpoints, `latest`, fl-state.krab: the run's state
  kShared,   // 0644: what a user hands on: report.json, model.pt, model.ts, --port-file
};

// Writes `data` to `path` atomically: a new temporary file in the same directory, fsync, rename
// over the target, fsync of the directory. A crash leaves either the old file or the new one,
// never a torn one. The temporary's name ends in 64 random bits and it is created with O_EXCL
// and O_NOFOLLOW, so nothing planted in the directory beforehand (a symlink to another file,
// say) can be written through; the rename replaces a symlink at `path` itself rather than
// following it. Missing parent directories are created as make_dirs() creates them. Throws
// krab::Error naming the path.
void write_file_atomic(const std::string& path, const std::string& data,
                       FileAccess access = FileAccess::kPrivate);

// write_file_atomic() for a file too large to hold: the bytes arrive through write() and go
// to a temporary beside `path` (created at construction, by write_file_atomic's rules: random
// name, O_EXCL | O_NOFOLLOW, the mode of `access`, missing directories made); commit() flushes
// it (fsync), renames it over `path` and fsyncs the directory. Until commit() returns, `path`
// is untouched; a writer destroyed without commit() (an exception on the way) removes its
// temporary. Errors throw krab::Error naming `path` (and remove the temporary). One thread.
class AtomicFileWriter : public ByteSink {
 public:
  explicit AtomicFileWriter(const std::string& path, FileAccess access = FileAccess::kPrivate);
  ~AtomicFileWriter() override;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const char* data, size_t n) override;
  using ByteSink::write;
  void commit();
  const std::string& path() const { return path_; }

 private:
  void abandon();  // closes and removes the temporary

  std::string path_, dir_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Reads a whole file. Missing or unreadable -> InvalidArgument naming the path.
std::string read_file(const std::string& path);

bool path_exists(const std::string& path);

// mkdir -p: each missing level is created with mode 0700 (less if the umask says so), since
// the directories krab creates hold a run's state (run directories, their step-N folders).
// Levels that exist already are left as they are. Throws krab::Error naming the path.
void make_dirs(const std::string& path);

// Checks, before any work is done, that files can later be created in directory `dir`: the
// missing part of the path is created, a probe file is written and removed, and what was
// created is removed again, so the check leaves nothing behind. (access(2) is not enough: it
// says yes to root for /proc and for read-only mounts.) Throws InvalidArgument
// "`what`: cannot write to 'dir': reason", where `what` names the key or flag that gave it.
void check_writable_dir(const std::string& dir, const std::string& what);

// The same for a file that will be written with write_file_atomic(): `path` must not be a
// directory and its directory must pass check_writable_dir (the directory must exist already:
// a report's directory is not created for it).
void check_writable_file(const std::string& path, const std::string& what);

// `json` as indented text, for reports. Strings that are not valid UTF-8 (a job named after a
// file whose name is in Latin-1, say) are written with each bad byte replaced by U+FFFD
// instead of throwing nlohmann's type_error.316: a report must never be lost to its contents.
std::string dump_json(const nlohmann::json& json);

}  // namespace krab::core
