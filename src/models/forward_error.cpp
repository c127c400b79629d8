#include "models/forward_error.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <vector>

namespace krab::models {
namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The interpreter's text: a header line, traceback blocks whose lines are indented or start
// with "Traceback of TorchScript", then "<Class>: <message>" at the left margin. The message is
// the first line at the margin after the header that is not a traceback title.
std::string interpreter_cause(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // "The following operation failed in the TorchScript interpreter."
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == ' ' || line[0] == '\t' || starts_with(line, "Traceback of"))
      continue;
    return starts_with(line, "RuntimeError: ") ? line.substr(14) : line;
  }
  return first_line(text);
}

}  // namespace

LibraryError describe_library_error(const std::exception& e) {
  LibraryError out;
  out.details = e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    // The C++ backtrace after the message locates LibTorch's code, not the user's mistake.
    out.details = c10->what_without_backtrace();
    out.cause = first_line(out.details);
  } else if (starts_with(out.details, "The following operation failed in the TorchScript")) {
    out.cause = interpreter_cause(out.details);
  } else {
    out.cause = first_line(out.details);
  }
  return out;
}

}  // namespace krab::models
