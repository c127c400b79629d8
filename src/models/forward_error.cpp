#include "models/forward_error.h"

#include <c10/util/Exception.h>

#include <regex>
#include <sstream>
#include <vector>

namespace krab::models {
namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The interpreter's text: a header line, traceback blocks (code excerpts, some of whose lines
// start at the margin, "class Body(Module):"), then "<Class>: <message>". The cause is the first
// line after the last traceback title that starts with an exception class's name.
std::string interpreter_cause(const std::string& text) {
  static const std::regex kClassLine(
      R"(^(builtins\.)?([A-Za-z_][A-Za-z0-9_.]*(Error|Exception)): )");
  const size_t last_title = text.rfind("\nTraceback of TorchScript");
  std::istringstream in(text.substr(last_title == std::string::npos ? 0 : last_title));
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, kClassLine)) continue;
    const std::string cls = m[2].str();
    const std::string message = line.substr(static_cast<size_t>(m.length(0)));
    return cls == "RuntimeError" ? message : cls + ": " + message;
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
