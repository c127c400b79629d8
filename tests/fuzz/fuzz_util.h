// What every fuzz target shares: the rule for what counts as a finding, and scratch files for
// the parsers that take a path.
//
// A parser given bytes someone else wrote may refuse them, with a krab::Error whose message a
// user can read. Anything else is a finding: a crash or sanitizer report (libFuzzer and
// ASan/UBSan see those themselves), an exception that is not a krab::Error (a raw
// YAML::Exception, nlohmann::json or c10::Error escaping the parser), or a message that quotes
// the input's bytes raw (control bytes; core/printable.h escapes them). A finding aborts, so
// libFuzzer saves the input that caused it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>

#include "core/errors.h"

namespace krab::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n*** krab fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

// Messages may span lines; any other byte below 0x20, or DEL, means input was quoted raw.
inline void check_printable_message(const char* message) {
  for (const char* p = message; *p; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if ((c < 0x20 && c != '\n') || c == 0x7f)
      finding(std::string("a krab::Error message quotes a raw control byte: ") + message);
  }
}

// Runs `fn` on one input: a krab::Error is a refusal (its message must be printable); any
// other exception is a finding.
template <typename Fn>
void refusals_only(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    check_printable_message(e.what());
  } catch (const std::exception& e) {
    finding(std::string("a ") + typeid(e).name() + " escaped the parser: " + e.what());
  }
}

// A scratch directory for this process, removed at exit. (Never destroyed itself, so the exit
// handler can still read it.)
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path* dir = [] {
    auto* d = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                        ("krab-fuzz-" + std::to_string(::getpid())));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

// Writes `data` to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  check(static_cast<bool>(out), "cannot write the scratch file " + path);
  return path;
}

}  // namespace krab::fuzz
