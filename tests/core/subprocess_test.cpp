// Helper programs (core/subprocess.h) see their input and nothing else of krab: not its
// environment (the job secret), not its descriptors, not a PATH search. Checked with the
// system's own /usr/bin/env and /bin/sh, which report what they were given.
#include "core/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <sstream>

#include "core/errors.h"

namespace krab::core {
namespace {

std::set<std::string> lines(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.insert(line);
  return out;
}

TEST(RunProgram, TheEnvironmentIsPathAndLocaleOnly) {
  const char* lc_all = std::getenv("LC_ALL");
  const std::string old_lc_all = lc_all ? lc_all : "";
  ::setenv("KRAB_JOB_SECRET", "s3cret", 1);
  ::setenv("LC_ALL", "C.UTF-8", 1);
  const ProgramResult r = run_program("/usr/bin/env", {}, "");
  ::unsetenv("KRAB_JOB_SECRET");
  if (lc_all)
    ::setenv("LC_ALL", old_lc_all.c_str(), 1);
  else
    ::unsetenv("LC_ALL");
  // Failures name variables, never their values: this process's environment may hold secrets.
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out.find("s3cret"), std::string::npos);
  const std::set<std::string> env = lines(r.out);
  EXPECT_TRUE(env.count("PATH=/usr/bin:/bin"));
  EXPECT_TRUE(env.count("LC_ALL=C.UTF-8"));
  for (const std::string& var : env) {
    const std::string name = var.substr(0, var.find('='));
    EXPECT_TRUE(name == "PATH" || name == "LANG" || name == "LANGUAGE" || name.rfind("LC_", 0) == 0)
        << "the program got " << name;
  }
}

TEST(RunProgram, TheProgramHoldsOnlyStdinStdoutAndStderr) {
  // Descriptors of this process that are not close-on-exec, as a library might leave them.
  const int file = ::open("/dev/null", O_RDONLY);
  int leaked[2];
  ASSERT_EQ(::pipe(leaked), 0);
  ASSERT_GE(file, 0);
  // The shell lists its own descriptors: ls runs as its child ("; exit 0" keeps the shell from
  // replacing itself with ls, whose own listing would show the directory it reads).
  const ProgramResult r = run_program("/bin/sh", {"-c", "ls /proc/$$/fd; exit 0"}, "");
  for (int fd : {file, leaked[0], leaked[1]}) ::close(fd);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(lines(r.out), (std::set<std::string>{"0", "1", "2"})) << r.out;
}

TEST(RunProgram, InputGoesInOutputComesBackAndTheStatusIsReported) {
  std::string big(3 << 20, 'x');  // larger than both pipes' buffers together
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = '\n';
  EXPECT_EQ(run_program("/bin/cat", {}, big).out, big);
  const ProgramResult r = run_program("/bin/sh", {"-c", "echo to-stderr >&2; exit 3"}, "");
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, "to-stderr\n");
}

TEST(RunProgram, OnlyAbsolutePathsAndAMissingProgramIsNamed) {
  // A bare name would mean a PATH search: refused rather than searched.
  EXPECT_THROW(run_program("env", {}, ""), InvalidArgument);
  try {
    run_program("/nonexistent/spm_encode", {}, "");
    ADD_FAILURE() << "a missing program ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/spm_encode"), std::string::npos);
  }
}

}  // namespace
}  // namespace krab::core
