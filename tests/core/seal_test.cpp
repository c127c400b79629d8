// Sealed files: HMAC-SHA256 under a key kept outside the run directory (core/seal.h).
#include "core/seal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/errors.h"

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

}  // namespace
}  // namespace krab::core
