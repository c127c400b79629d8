#include "cli/private_dir.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/errors.h"

namespace krab::cli {

PrivateDir::PrivateDir(const std::string& what, const std::string& purpose) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = str_cat(tmp && *tmp ? tmp : "/tmp", "/krab-", what, "-XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr)
    throw Error(str_cat("cannot create a directory for ", purpose, " in ", templ, ": ",
                        std::strerror(errno)));
  path = templ;
}

PrivateDir::~PrivateDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace krab::cli
