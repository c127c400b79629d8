// Internal to krab_secagg (not part of its interface): the little-endian byte writer and the
// bounds-checked reader behind every to_bytes()/from_bytes() of shamir.h and secagg.h, and the
// one-time libsodium initialisation.
//
// Every read checks the bytes left first and throws krab::CorruptData naming the message and
// the offset, so a truncated or garbage buffer never reads out of bounds. count() bounds an
// element count by the bytes that remain before anyone reserves memory for it, so a forged
// count of 2^32 costs nothing. finish() rejects trailing bytes: every format here is canonical,
// which also makes to_bytes().size() the exact number of bytes a message costs on the wire.
#pragma once

#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"

namespace krab::federated::secagg::wire {

// sodium_init() is idempotent and thread-safe; the function-local static makes us pay for it
// once per process. Every entry point that touches libsodium calls this first.
inline void ensure_sodium() {
  static const int rc = sodium_init();
  if (rc < 0) throw ::krab::Error("secagg: libsodium failed to initialise (sodium_init)");
}

class Writer {
 public:
  explicit Writer(size_t reserve = 0) { buf_.reserve(reserve); }

  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void bytes(const uint8_t* data, size_t n) { buf_.insert(buf_.end(), data, data + n); }
  void magic(const char (&tag)[5]) { bytes(reinterpret_cast<const uint8_t*>(tag), 4); }
  // A u32 length, then the bytes.
  void blob(const std::vector<uint8_t>& b) {
    u32(static_cast<uint32_t>(b.size()));
    bytes(b.data(), b.size());
  }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  // `what` names the message in error messages ("secagg ShareKeys"); it must outlive the reader.
  Reader(const uint8_t* data, size_t size, const char* what) : p_(data), n_(size), what_(what) {}

  size_t remaining() const { return n_ - pos_; }

  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return v;
  }
  void bytes(uint8_t* out, size_t n) {
    need(n);
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
  }
  void magic(const char (&tag)[5]) {
    need(4);
    if (std::memcmp(p_ + pos_, tag, 4) != 0)
      throw ::krab::CorruptData(::krab::str_cat(what_, ": bad magic (not a ", what_, " message)"));
    pos_ += 4;
  }
  // A u32 length-prefixed byte string, returned as a view into the buffer.
  std::pair<const uint8_t*, size_t> blob() {
    const size_t len = u32();
    need(len);
    const uint8_t* start = p_ + pos_;
    pos_ += len;
    return {start, len};
  }
  // A u32 element count, each element at least `min_element_bytes` long on the wire.
  size_t count(size_t min_element_bytes) {
    const size_t c = u32();
    if (min_element_bytes > 0 && c > remaining() / min_element_bytes)
      throw ::krab::CorruptData(::krab::str_cat(what_, ": count ", c, " at byte ", pos_ - 4,
                                                " exceeds the ", remaining(), " bytes left"));
    return c;
  }
  void finish() const {
    if (pos_ != n_)
      throw ::krab::CorruptData(
          ::krab::str_cat(what_, ": ", n_ - pos_, " trailing bytes after byte ", pos_));
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw ::krab::CorruptData(::krab::str_cat(what_, ": ", why));
  }

 private:
  void need(size_t k) const {
    if (k > n_ - pos_)
      throw ::krab::CorruptData(::krab::str_cat(what_, ": truncated (needed ", k, " bytes at byte ",
                                                pos_, ", have ", n_ - pos_, ")"));
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const char* what_;
};

}  // namespace krab::federated::secagg::wire
