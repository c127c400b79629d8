// Bytes someone else wrote, made safe to put in an error message.
//
// A message that quotes a file's or a peer's bytes must not carry them raw: a NUL cuts the
// message short wherever it is read as a C string (what() printed by the CLI, a log line), and
// control bytes or escape sequences rewrite the user's terminal. printable() keeps printable
// ASCII as it is and writes every other byte, and the backslash itself, as a C escape (\n, \t,
// \r, \\, or \xNN), so the message shows exactly which bytes were there. Input longer than
// `max_bytes` is cut there and "..." appended, so a megabyte of garbage stays one line.
//
// printable_text() is for whole messages that may quote such bytes (a path is any bytes on
// Linux, and a message naming it is printed): it keeps well-formed UTF-8 ("é", "—"), newlines
// and tabs, and writes other control bytes (ESC, CR, C1) and bytes that are not part of
// well-formed UTF-8 as \xNN. It leaves the backslash alone, so an escape printable() already
// wrote reads the same.
#pragma once

#include <cstddef>
#include <cstdint>
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

// The length of the well-formed UTF-8 sequence of one character at the start of `bytes` (1 to
// 4; 1 for ASCII), or 0 when it does not start with one: a continuation byte, an overlong form,
// a surrogate, beyond U+10FFFF, or cut short.
inline size_t utf8_sequence_length(std::string_view bytes) {
  if (bytes.empty()) return 0;
  const auto c = static_cast<unsigned char>(bytes[0]);
  if (c < 0x80) return 1;
  size_t more;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) {
    more = 1, cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    more = 2, cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    more = 3, cp = c & 0x07;
  } else {
    return 0;
  }
  if (bytes.size() <= more) return 0;
  for (size_t i = 1; i <= more; ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if ((b & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3f);
  }
  const uint32_t min = more == 1 ? 0x80 : more == 2 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return more + 1;
}

inline std::string printable_text(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_sequence_length(text.substr(i));
    // C1 controls (U+0080..U+009F, encoded C2 80..C2 9F) act on terminals like C0 ones.
    const bool control =
        n == 1 ? ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
               : n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if (n == 0 || control) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
      ++i;
      continue;
    }
    out.append(text, i, n);
    i += n;
  }
  return out;
}

}  // namespace krab::core
