// Little-endian fixed-width fields in byte strings: the framing of krab's files (checkpoint
// frames, shard files, records). krab builds for little-endian hosts only, so a field's bytes
// are its memory bytes. get() does not check bounds: callers check the length first.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>

namespace krab::core {

template <typename T>
void put_le(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <typename T>
T get_le(const std::string& in, size_t at) {
  static_assert(std::is_trivially_copyable_v<T>);
  T v;
  std::memcpy(&v, in.data() + at, sizeof(v));
  return v;
}

}  // namespace krab::core
