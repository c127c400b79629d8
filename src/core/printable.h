// Bytes someone else wrote, made safe to put in an error message.
//
// A message that quotes a file's or a peer's bytes must not carry them raw: a NUL cuts the
// message short wherever it is read as a C string (what() printed by the CLI, a log line), and
// control bytes or escape sequences rewrite the user's terminal. printable() keeps printable
// ASCII as it is and writes every other byte, and the backslash itself, as a C escape (\n, \t,
// \r, \\, or \xNN), so the message shows exactly which bytes were there. Input longer than
// `max_bytes` is cut there and "..." appended, so a megabyte of garbage stays one line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace krab::core {

inline std::string printable(std::string_view bytes, size_t max_bytes = 200) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() < max_bytes ? bytes.size() : max_bytes);
  for (size_t i = 0; i < bytes.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out += static_cast<char>(c);
        } else {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        }
    }
  }
  if (bytes.size() > max_bytes) out += "...";
  return out;
}

}  // namespace krab::core
