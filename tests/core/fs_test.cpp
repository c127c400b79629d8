// The atomic writer (core/fs.h) in a directory someone else can write to: names planted before
// krab writes (symlinks at every temporary name the writer used to pick, PATH.tmp.<pid>) are
// never written through, and the modes krab asks for are what the files and directories get,
// less what the umask removes.
#include "core/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace krab::core {
namespace {

namespace fs = std::filesystem;

class AtomicWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-fs-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ::umask(old_umask_);
    fs::remove_all(dir_);
  }
  // The mode in octal ("0600"), so that a failure reads like ls -l.
  static std::string mode_of(const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    char text[8];
    std::snprintf(text, sizeof(text), "%04o", st.st_mode & 07777);
    return text;
  }
  fs::path dir_;
  const mode_t old_umask_ = ::umask(022);
};

TEST_F(AtomicWriter, SymlinksAtEveryOldTemporaryNameAreNotWrittenThrough) {
  const fs::path victim = dir_ / "victim";
  std::ofstream(victim) << "precious";
  const fs::path target = dir_ / "report.json";
  // The names the old writer could pick in this process, and in any process of a small pid
  // range: each a symlink to the victim.
  std::vector<pid_t> pids{::getpid()};
  for (pid_t p = 1; p <= 1024; ++p) pids.push_back(p);
  for (pid_t p : pids) {
    std::error_code ec;
    fs::create_symlink(victim, target.string() + ".tmp." + std::to_string(p), ec);
  }
  const auto entries = [&] {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  };
  const size_t planted = entries();

  write_file_atomic(target.string(), "{\"ok\": true}\n", FileAccess::kShared);
  EXPECT_EQ(read_file(victim.string()), "precious");
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_EQ(read_file(target.string()), "{\"ok\": true}\n");
  // Nothing left behind but the target itself.
  EXPECT_EQ(entries(), planted + 1);

  // A symlink at the target's own name is replaced, not followed.
  const fs::path state = dir_ / "state.krab";
  fs::create_symlink(victim, state);
  write_file_atomic(state.string(), "state");
  EXPECT_EQ(read_file(victim.string()), "precious");
  EXPECT_FALSE(fs::is_symlink(state));
  EXPECT_EQ(read_file(state.string()), "state");
}

TEST_F(AtomicWriter, ModesArePrivateForStateAndReadableForOutputsLessTheUmask) {
  ::umask(022);
  write_file_atomic((dir_ / "runs/job/step-1/state.krab").string(), "s");
  write_file_atomic((dir_ / "report.json").string(), "r", FileAccess::kShared);
  EXPECT_EQ(mode_of(dir_ / "runs/job/step-1/state.krab"), "0600");
  EXPECT_EQ(mode_of(dir_ / "report.json"), "0644");
  // Every directory the writer created is the owner's alone.
  for (const char* d : {"runs", "runs/job", "runs/job/step-1"})
    EXPECT_EQ(mode_of(dir_ / d), "0700") << d;
  // Rewriting a file gives it the mode again (the old file is replaced, not reopened).
  ASSERT_EQ(::chmod((dir_ / "runs/job/step-1/state.krab").c_str(), 0666), 0);
  write_file_atomic((dir_ / "runs/job/step-1/state.krab").string(), "s2");
  EXPECT_EQ(mode_of(dir_ / "runs/job/step-1/state.krab"), "0600");

  // The umask can only take bits away.
  ::umask(077);
  write_file_atomic((dir_ / "out/model.pt").string(), "m", FileAccess::kShared);
  EXPECT_EQ(mode_of(dir_ / "out/model.pt"), "0600");
  EXPECT_EQ(mode_of(dir_ / "out"), "0700");
  ::umask(0);
  write_file_atomic((dir_ / "wide/latest").string(), "l");
  EXPECT_EQ(mode_of(dir_ / "wide/latest"), "0600");
  EXPECT_EQ(mode_of(dir_ / "wide"), "0700");
}

TEST_F(AtomicWriter, MakeDirsLeavesExistingLevelsAndRefusesAFileInThePath) {
  fs::create_directories(dir_ / "shared");
  fs::permissions(dir_ / "shared", fs::perms::owner_all | fs::perms::group_all);
  make_dirs((dir_ / "shared/runs/").string());
  EXPECT_EQ(mode_of(dir_ / "shared"), "0770");
  EXPECT_EQ(mode_of(dir_ / "shared/runs"), "0700");
  std::ofstream(dir_ / "file") << "x";
  try {
    make_dirs((dir_ / "file/sub").string());
    ADD_FAILURE() << "a file in the path was taken for a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  }
}

// `--report afile/r.json` with afile a regular file: the message says what afile is, not that a
// directory is missing.
TEST_F(AtomicWriter, AFileWhereADirectoryShouldBeIsNamedAsAFile) {
  std::ofstream(dir_ / "afile") << "x";
  const auto refusal = [](const std::string& path) -> std::string {
    try {
      check_writable_file(path, "--report");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::string file_msg = refusal((dir_ / "afile/r.json").string());
  EXPECT_NE(file_msg.find("is a file, not a directory"), std::string::npos) << file_msg;
  EXPECT_EQ(file_msg.find("does not exist"), std::string::npos) << file_msg;
  const std::string missing_msg = refusal((dir_ / "nothing/r.json").string());
  EXPECT_NE(missing_msg.find("does not exist"), std::string::npos) << missing_msg;
}

// The streaming writer: nothing at the target until commit(); a writer dropped without commit()
// (an exception while streaming) leaves the old file and no temporary behind.
TEST_F(AtomicWriter, AStreamedFileAppearsOnlyAtCommitAndAnAbandonedOneLeavesNothing) {
  const fs::path target = dir_ / "shard.krab";
  write_file_atomic(target.string(), "old");
  {
    AtomicFileWriter out(target.string());
    out.write("new ");
    out.write("bytes");
    EXPECT_EQ(read_file(target.string()), "old");
  }
  EXPECT_EQ(read_file(target.string()), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  {
    AtomicFileWriter out(target.string());
    out.write("new ");
    out.write("bytes");
    out.commit();
    EXPECT_THROW(out.write("x"), Error);
  }
  EXPECT_EQ(read_file(target.string()), "new bytes");
  EXPECT_EQ(mode_of(target), "0600");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// A rename that fails (a directory where the file goes) throws naming the target and removes
// the temporary.
TEST_F(AtomicWriter, AFailedCommitNamesTheFileAndRemovesTheTemporary) {
  const fs::path target = dir_ / "shard.krab";
  fs::create_directories(target / "inside");
  AtomicFileWriter out(target.string());
  out.write("bytes");
  try {
    out.commit();
    ADD_FAILURE() << "the commit over a directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard.krab"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace krab::core
