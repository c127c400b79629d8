// Sealed files: HMAC-SHA256 under a key kept outside the run directory (core/seal.h).
#include "core/seal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/errors.h"
#include "core/fs.h"
#include "core/release_counter.h"

namespace krab::core {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Seal, ASealedFileReadsBackAndAnyChangeIsRefused) {
  const std::string key(32, 'k'), other(32, 'o');
  const std::string file = "checkpoint bytes";
  const std::string sealed = seal(file, key);
  EXPECT_EQ(sealed.size(), file.size() + 40);
  EXPECT_EQ(unseal(sealed, key, "state.krab"), file);
  // One flipped bit anywhere, a file sealed with another key, an unsealed file: all refused.
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] ^= 0x01;
    EXPECT_THROW(unseal(bad, key, "state.krab"), CorruptData) << "bit at byte " << i;
  }
  EXPECT_NE(error_of([&] { unseal(seal(file, other), key, "state.krab"); }).find("fails its seal"),
            std::string::npos);
  EXPECT_NE(error_of([&] { unseal(file, key, "state.krab"); }).find("carries no seal"),
            std::string::npos);
  // Without a key: plain files as before, and a sealed one is named rather than misread.
  EXPECT_EQ(unseal(file, "", "state.krab"), file);
  EXPECT_EQ(seal(file, ""), file);
  EXPECT_NE(error_of([&] { unseal(sealed, "", "state.krab"); }).find("checkpoint.hmac_key_file"),
            std::string::npos);
}

TEST(Seal, TheKeyFileMustBeLongAndOutsideTheRunDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("krab-seal-" + std::to_string(::getpid()));
  fs::create_directories(dir / "run");
  std::ofstream(dir / "key") << std::string(64, 'a');
  std::ofstream(dir / "short") << "tiny";
  std::ofstream(dir / "run" / "key") << std::string(64, 'a');
  EXPECT_EQ(read_seal_key((dir / "key").string(), (dir / "run").string()), std::string(64, 'a'));
  EXPECT_EQ(read_seal_key("", (dir / "run").string()), "");
  EXPECT_NE(error_of([&] {
              read_seal_key((dir / "run" / "key").string(), (dir / "run").string());
            }).find("inside the run directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_seal_key((dir / "short").string(), (dir / "run").string());
            }).find("at least 32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_seal_key((dir / "none").string(), (dir / "run").string());
            }).find("does not exist"),
            std::string::npos);
  fs::remove_all(dir);
}

// A seal is bound to its job: the same bytes sealed for one run directory or model fail their
// seal in another, so a sealed file cannot be moved between runs.
TEST(Seal, ASealIsBoundToItsJob) {
  const std::string key(32, 'k'), file = "state bytes";
  const std::string a = job_identity("fl", "runs/a", "w:[2];"),
                    b = job_identity("fl", "runs/b", "w:[2];");
  const std::string other_model = job_identity("fl", "runs/a", "w:[3];");
  EXPECT_EQ(job_identity("fl", "runs/./a/", "w:[2];"), job_identity("fl", "runs/a/", "w:[2];"));
  const std::string sealed = seal(file, key, a);
  EXPECT_EQ(unseal(sealed, key, "fl-state.krab", a), file);
  for (const std::string& job : {b, other_model, std::string()})
    EXPECT_NE(error_of([&] { unseal(sealed, key, "fl-state.krab", job); }).find("fails its seal"),
              std::string::npos);
}

TEST(ReleaseCounter, GrowsOnlyIsPerJobAndCannotBeForgedOrMoved) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("krab-counter-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string key_file = (dir / "key").string(), key(32, 'k');
  const ReleaseCounter a(key_file, key, "job a"), b(key_file, key, "job b");
  EXPECT_EQ(fs::path(a.path()).parent_path(), dir);  // beside the key
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(a.value(), 0);
  a.advance(3);
  a.advance(2);  // never lowers
  EXPECT_EQ(a.value(), 3);
  EXPECT_EQ(ReleaseCounter(key_file, key, "job a").value(), 3);  // durable
  EXPECT_EQ(b.value(), 0);
  // Job b's counter copied over job a's, or a changed count: refused.
  const std::string saved = read_file(a.path());
  b.advance(1);
  fs::copy_file(b.path(), a.path(), fs::copy_options::overwrite_existing);
  EXPECT_NE(error_of([&] { a.value(); }).find("fails its check"), std::string::npos);
  std::string edited = saved;
  edited[8] = 1;  // 3 -> 1
  std::ofstream(a.path(), std::ios::binary | std::ios::trunc) << edited;
  EXPECT_THROW(a.value(), CorruptData);
  std::ofstream(a.path(), std::ios::binary | std::ios::trunc) << saved;
  EXPECT_EQ(a.value(), 3);
  EXPECT_NE(ReleaseCounter(key_file, std::string(32, 'o'), "job a").path(), a.path());
  // No key file: no counter.
  const ReleaseCounter off("", "", "job a");
  EXPECT_FALSE(off.enabled());
  off.advance(5);
  EXPECT_EQ(off.value(), 0);
  fs::remove_all(dir);
}

// The streamed seal is the seal of the same bytes fed in pieces; off without a key. SHA-256 of
// "abc" is FIPS 180-2's example digest.
TEST(Seal, AStreamedSealEqualsTheSealOfTheWholeBytes) {
  const std::string key(32, 'k'), body = "a checkpoint shard's bytes";
  SealStream s(key, "job-a");
  s.update(body.data(), 5);
  s.update(body.data() + 5, body.size() - 5);
  EXPECT_EQ(body + s.finish(), seal(body, key, "job-a"));
  SealStream off("", "job-a");
  off.update(body.data(), body.size());
  EXPECT_EQ(off.finish(), "");
  EXPECT_EQ(sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256Stream h;
  h.update("a", 1);
  h.update("bc", 2);
  EXPECT_EQ(h.hex(), sha256_hex("abc", 3));
}

}  // namespace
}  // namespace krab::core
