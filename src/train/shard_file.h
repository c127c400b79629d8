// One shard file of a sharded checkpoint (docs/design/zero-sharding.md §4.1): the frame around
// a record that is written in one pass, never held in memory.
//
//   "KRABSHRD" | u32 version 1 | u64 payload length | payload (a record, core/record.h)
//   | u32 CRC-32 of the payload | seal (core/seal.h: "KRABSEAL" + HMAC of everything before it;
//   present exactly when the run has checkpoint.hmac_key_file)
//
// state.krab's frame puts the CRC in the header, which needs the payload before the first
// byte is written; here the length is known up front (RecordStreamWriter::size()) and the CRC,
// the seal and the SHA-256 the manifest records are computed while the bytes stream past.
//
// Reading is not streamed yet: a shard is read whole, checked (digest, seal, frame, CRC, then
// every record entry by Record::parse) and parsed; the reader keeps the shards it needs.
#pragma once

#include <cstdint>
#include <string>

#include "core/record.h"

namespace krab::train {

// What the manifest records of a shard file: its size and the SHA-256 of all its bytes.
struct ShardDigest {
  uint64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

// Writes `record` framed (and sealed under `seal_key` for `job` when the key is not "") to
// `path` atomically (core::AtomicFileWriter): until it returns, `path` is untouched. Throws
// krab::Error naming `path`.
ShardDigest write_shard_file(const std::string& path, const core::RecordStreamWriter& record,
                             const std::string& seal_key, const std::string& job);

// The record in a shard file's bytes, after checking its seal (core::unseal's rules: a sealed
// file without a key, an unsealed one with a key, a wrong seal), magic, version, length and
// CRC. CorruptData naming `source` for every failure. Pure: the fuzz target's entry point.
core::Record parse_shard_bytes(std::string bytes, const std::string& source,
                               const std::string& seal_key, const std::string& job);

// Reads `path` whole and checks it against `want` (size, then SHA-256) before
// parse_shard_bytes. A missing file, a size or digest that differs: CorruptData naming `path`.
core::Record read_shard_file(const std::string& path, const ShardDigest& want,
                             const std::string& seal_key, const std::string& job);

}  // namespace krab::train
