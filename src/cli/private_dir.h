// A directory only this user can enter (mkdtemp's 0700), removed with the object: where the
// launcher keeps what its workers and only they share — a one-node job's FileStore ("rdzv"),
// the workers' parts of --trace ("trace"), their monitoring snapshots ("monitor").
#pragma once

#include <string>

namespace krab::cli {

struct PrivateDir {
  // In TMPDIR, else /tmp, named krab-<what>-XXXXXX. Throws krab::Error naming what it was for
  // (`purpose`) when it cannot be made.
  PrivateDir(const std::string& what, const std::string& purpose);
  ~PrivateDir();
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;
  std::string path;
};

}  // namespace krab::cli
