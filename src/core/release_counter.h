// A count of released rounds that only grows, kept where a run directory's owner cannot roll it
// back: beside the seal key (checkpoint.hmac_key_file).
//
// A seal (core/seal.h) proves that krab wrote a file for this job, not that it is the newest
// such file. Whoever can write the run directory could put back fl-state.krab from round 3
// after round 9, or delete it, and a resumed run would report the privacy cost of 3 rounds (or
// of none) although 9 were released. So before a round's result is persisted or reported, the
// server raises this counter; on resume a state that says fewer rounds, or no state at all, is
// refused.
//
// The counter is one file per job next to the key:
//   KEYFILE.rounds-<16 hex digits of HMAC(key, job)>
//   "KRABRND1" | i64 rounds | HMAC-SHA256(HMAC(key, "krab-release-counter\n" + job), the above)
// It is rewritten atomically (core::write_file_atomic); its MAC makes it unforgeable without
// the key, and its place makes it as safe from roll-back as the key's directory is from the
// run directory's owner. Deleting it (which needs write access to the key's directory) forgets
// the job's releases: that is how the key's owner deliberately lets a run start over.
//
// Errors: CorruptData naming the counter file when it is damaged or forged; krab::Error when it
// cannot be written. Not thread-safe; one process per job at a time (as for the run directory).
#pragma once

#include <cstdint>
#include <string>

namespace krab::core {

class ReleaseCounter {
 public:
  // `key_file`: checkpoint.hmac_key_file ("" = no counter: value() is 0, advance() does
  // nothing); `key`: its bytes (core::read_seal_key); `job`: core::job_identity().
  ReleaseCounter(const std::string& key_file, std::string key, std::string job);

  bool enabled() const { return !key_.empty(); }
  // The file's path ("" when disabled).
  const std::string& path() const { return path_; }

  // Rounds released so far: 0 when the file does not exist.
  int64_t value() const;
  // Records that `rounds` have been released; the file is durable when this returns. Never
  // lowers the count.
  void advance(int64_t rounds) const;

 private:
  std::string key_, job_, path_;
};

}  // namespace krab::core
