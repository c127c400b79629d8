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
// Reading never holds the file: its size is checked against the manifest's first (a stat, no
// byte read), then one streaming pass of 1 MiB chunks computes the SHA-256, the seal and the
// CRC, which are checked in that order, and the record is walked into a core::RecordIndex; a
// reader then takes the entries, or ranges of them, that it needs with pread. The file stays
// open from the check to the last read, so a file renamed over it meanwhile is not read; one
// rewritten in place between the two is not detected (the digests cover the pass, not each
// later read), and one cut short meanwhile fails the read that reaches past its end
// (CorruptData) — after the restore's agreement, so that rank has installed part of it.
// Both need someone writing into the run's own files while it resumes.
#pragma once

#include <cstdint>
#include <memory>
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
// CRC. CorruptData naming `source` for every failure. Pure: the fuzz target's entry point; the
// same checks as open_shard_file() but the digest.
core::Record parse_shard_bytes(std::string bytes, const std::string& source,
                               const std::string& seal_key, const std::string& job);

// The shard in `file` (file->name() in messages), checked against `want` — its size before any
// byte is read, then in one streaming pass its SHA-256, seal, frame and CRC — and indexed.
// CorruptData naming the file for each failure (in that order). The index keeps `file`.
core::RecordIndex open_shard_file(std::shared_ptr<const core::ByteSource> file,
                                  const ShardDigest& want, const std::string& seal_key,
                                  const std::string& job);

// open_shard_file() of the file at `path` (core::FileSource). A missing file: CorruptData
// naming `path` and why every rank must see it.
core::RecordIndex read_shard_file(const std::string& path, const ShardDigest& want,
                                  const std::string& seal_key, const std::string& job);

}  // namespace krab::train
