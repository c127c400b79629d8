// Small file-system helpers that keep the "nothing half-written" promise.
#pragma once

#include <string>

namespace krab::core {

// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename
// over the target, fsync of the directory. A crash leaves either the old file or the new one,
// never a torn one. Parent directories are created. Throws krab::Error naming the path.
void write_file_atomic(const std::string& path, const std::string& data);

// Reads a whole file. Missing or unreadable -> InvalidArgument naming the path.
std::string read_file(const std::string& path);

bool path_exists(const std::string& path);

// mkdir -p. Throws krab::Error naming the path.
void make_dirs(const std::string& path);

}  // namespace krab::core
