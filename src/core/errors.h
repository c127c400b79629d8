// krab's error hierarchy and check macros.
//
// Inside a process krab reports failures with exceptions (LibTorch throws too). The hierarchy
// is small on purpose: the CLI maps each kind to an exit code and every message is meant to be
// read by a user, so it names the key, file, rank or op at fault.
//
//   Error                 base; runtime failure               -> exit 1
//   ├─ InvalidArgument    the caller's (user's) mistake        -> exit 2
//   ├─ NotSupported       valid request this build cannot do   -> exit 2
//   ├─ CorruptData        a file or message failed its checks  -> exit 2
//   ├─ Timeout            a blocking call ran out of time      -> exit 1
//   └─ PeerLost           a peer process died or disconnected  -> exit 1
//       └─ MembershipChanged  the group was abandoned (elastic)  -> exit 1
//
// KRAB_CHECK_ARG(cond, msg...) throws InvalidArgument; KRAB_CHECK(cond, msg...) is for internal
// invariants and throws Error with the file and line (a bug in krab, not in the input).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace krab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  // Process exit code the CLI uses for this kind of failure.
  virtual int exit_code() const { return 1; }
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

class NotSupported : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

class CorruptData : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

class Timeout : public Error {
 public:
  using Error::Error;
};

class PeerLost : public Error {
 public:
  using Error::Error;
};

// The group an operation ran on was abandoned on purpose (comm::Communicator::abort): its
// membership changed and a group of the next generation takes over. Elastic training catches
// it and recovers; everywhere else it is a PeerLost like any other (code that catches PeerLost,
// such as the CLI's exit-code mapping, still handles it). `reason()` is the text abort() was
// given ("death of rank 2", "test"); what() says the group was aborted and carries it.
class MembershipChanged : public PeerLost {
 public:
  explicit MembershipChanged(const std::string& reason)
      : PeerLost("the group was aborted: " + reason), reason_(reason) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

namespace detail {
inline void format_to(std::ostringstream&) {}
template <typename T, typename... Rest>
void format_to(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  format_to(os, rest...);
}
}  // namespace detail

// Concatenates its arguments with operator<<.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::format_to(os, args...);
  return os.str();
}

}  // namespace krab

#define KRAB_CHECK_ARG(cond, ...)                                             \
  do {                                                                        \
    if (!(cond)) throw ::krab::InvalidArgument(::krab::str_cat(__VA_ARGS__)); \
  } while (0)

#define KRAB_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::krab::Error(::krab::str_cat("internal error at ", __FILE__, ":", __LINE__, ": ", \
                                          #cond, " ", ##__VA_ARGS__));                         \
  } while (0)
