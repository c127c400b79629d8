// Fuzzes the readers of a sharded checkpoint's files: a shard's frame and record
// (parse_shard_bytes, train/shard_file.h) and a manifest's record (read_manifest,
// train/manifest.h: the layout rebuilt from its parameter lists, the digests per rank).
//
// As in fuzz_checkpoint, a random frame almost never passes its CRC-32, so the first byte picks
// a mode: bit 0 set, the rest is the whole file; clear, the rest is the payload and a valid frame
// is put around it. Bit 1 picks the manifest instead of a shard. The only acceptable outcomes
// are a parsed file or a krab::Error naming it; no byte reaches a LibTorch parser.
#include <zlib.h>

#include "fuzz/fuzz_util.h"
#include "train/checkpoint.h"
#include "train/manifest.h"
#include "train/shard_file.h"

namespace {

uint32_t crc_of(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), p, static_cast<uInt>(n)));
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string shard_frame(const uint8_t* payload, size_t n) {
  std::string out("KRABSHRD", 8);
  put<uint32_t>(out, 1);
  put<uint64_t>(out, n);
  out.append(reinterpret_cast<const char*>(payload), n);
  put<uint32_t>(out, crc_of(payload, n));
  return out;
}

std::string manifest_frame(const uint8_t* payload, size_t n) {
  std::string out("KRABCKPT", 8);
  put<uint32_t>(out, 2);
  put<uint64_t>(out, n);
  put<uint32_t>(out, crc_of(payload, n));
  out.append(reinterpret_cast<const char*>(payload), n);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool whole = data[0] & 1, manifest = data[0] & 2;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  const std::string bytes = whole      ? std::string(reinterpret_cast<const char*>(p), n)
                            : manifest ? manifest_frame(p, n)
                                       : shard_frame(p, n);
  krab::fuzz::refusals_only([&] {
    if (manifest)
      krab::train::read_manifest(krab::train::parse_checkpoint(bytes, "manifest.krab"));
    else
      krab::train::parse_shard_bytes(bytes, "shard-00000-of-00001.krab", "", "");
  });
  return 0;
}
