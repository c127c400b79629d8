// Small files that state large sizes, run through `krab train` (issue 24, item 3): each is
// refused with exit 2, in seconds, naming the file (and the key that would let it through),
// before workers start, while the peak resident memory of the launcher and every process it
// started stays under 500 MiB. Before the checks these were, on the same machine: a 4 KB tensor
// file holding an expanded view, 1.1 GB resident; a 65-byte PNG stating 65535 x 65535, 4.4 GB
// then a decode error; a 300-byte JPEG stating 30000 x 30000, accepted and trained at 1.06 GB;
// one label of 2*10^7, 6.6 GB and killed at 120 s.
//
// Measured from outside, as shards_memory_e2e_test.cpp does: the job runs as a child of this
// test, whose wait4() reports the largest peak RSS (ru_maxrss) of that child and of every
// descendant it reaped. So that a reader which believes a bomb fails this test instead of
// taking the machine's memory, the child runs under an address-space limit (RLIMIT_AS, which
// its workers inherit) far below what the bombs state and a deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/cli_support.h"
#include "core/fs.h"
#include "image_util.h"

namespace {

using namespace krab::cli_test;

constexpr int64_t kPeakLimitMib = 500;
// A refusal ran here under 1 GiB of address space (LibTorch's mappings and thread stacks); the
// bombs state more than 4 GiB, except the expanded tensor (1.1 GB), which the peak bound catches.
constexpr rlim_t kAddressSpace = rlim_t{4} << 30;
constexpr int kDeadlineS = 60;

const char* kWriteTensors = R"PY(
import os, sys, torch
d = sys.argv[1]
# 4 KB each: one 28 x 28 image and one label, stated 10^6 (10^9) times by a zero stride.
for name, n in (("expanded.pt", 10**6), ("expanded_1e9.pt", 10**9)):
    torch.save({"x": torch.zeros(1, 1, 28, 28).expand(n, 1, 28, 28),
                "y": torch.zeros(1, dtype=torch.long).expand(n)}, os.path.join(d, name))
y = torch.zeros(100, dtype=torch.long)
y[7] = 2 * 10**7
torch.save({"x": torch.randn(100, 4), "y": y}, os.path.join(d, "label.pt"))
)PY";

struct Outcome {
  int code = -1;  // exit code; -1 when killed or still running at the deadline
  double seconds = 0;
  int64_t peak_mib = 0;  // the largest peak RSS of the launcher and the processes it reaped
  std::string log;
};

class Bombs : public Cli {
 protected:
  // `krab train job.yaml` with `job` in the test's directory, capped as the header says.
  Outcome train(const std::string& name, const std::string& job) {
    write("job.yaml", job);
    const std::string log = (dir_ / (name + ".log")).string();
    const auto start = std::chrono::steady_clock::now();
    std::fflush(stdout);  // or the child's stdout would write this test's buffer again
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::chdir(dir_.c_str());
      std::freopen(log.c_str(), "w", stderr);
      std::freopen(log.c_str(), "a", stdout);
      const rlimit cap{kAddressSpace, kAddressSpace};
      ::setrlimit(RLIMIT_AS, &cap);
      // Few threads and malloc arenas, whose reservations count against the cap on a machine
      // with many cores; they change nothing krab checks.
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::setenv("MALLOC_ARENA_MAX", "2", 1);
      ::execl(kKrab.c_str(), kKrab.c_str(), "train", "job.yaml", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    rusage usage{};
    pid_t got = 0;
    while ((got = ::wait4(pid, &status, WNOHANG, &usage)) == 0 &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(kDeadlineS))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (got == 0) {
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &usage);
    }
    Outcome out;
    out.code = got != 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.peak_mib = usage.ru_maxrss >> 10;  // KiB on Linux
    out.log = krab::core::read_file(log);
    std::printf("%s: exit %d in %.1f s, peak RSS %lld MiB\n", name.c_str(), out.code, out.seconds,
                static_cast<long long>(out.peak_mib));
    return out;
  }

  // Refused as the header says, with every one of `parts` in its one-line message.
  void expect_bomb_refused(const std::string& name, const std::string& job,
                           std::initializer_list<std::string> parts) {
    SCOPED_TRACE(name);
    const Outcome r = train(name, job);
    EXPECT_EQ(r.code, 2) << r.log;
    EXPECT_LT(r.seconds, 30.0) << r.log;
    EXPECT_GT(r.peak_mib, 0);
    EXPECT_LT(r.peak_mib, kPeakLimitMib) << r.log;
    for (const std::string& part : parts)
      EXPECT_NE(r.log.find(part), std::string::npos) << r.log << " lacks " << part;
    EXPECT_EQ(r.log.find("worker"), std::string::npos) << "workers started: " << r.log;
  }

  void write_tensors() {
    const std::string script = write("write.py", kWriteTensors);
    ASSERT_EQ(run(std::string(KRAB_PYTHON) + " " + script + " " + dir_.string()).code, 0);
    ASSERT_LT(fs::file_size(dir_ / "expanded.pt"), 8192u);
    ASSERT_LT(fs::file_size(dir_ / "label.pt"), 16384u);
  }

  // An image folder: class "a" holds `bomb` (bytes), class "b" one real 8 x 8 PNG. Returns the
  // bomb's path as the job names it (data.path is relative).
  std::string image_folder(const std::string& bomb, const std::string& bytes) {
    fs::create_directories(dir_ / "images" / "a");
    fs::create_directories(dir_ / "images" / "b");
    krab::data::testing::write_png((dir_ / "images" / "b" / "ok.png").string(), 8, 8, 1,
                                   krab::data::testing::make_pixels(0, 8, 8, 1));
    const fs::path path = dir_ / "images" / "a" / bomb;
    std::ofstream(path, std::ios::binary) << bytes;
    return "images/a/" + bomb;
  }
};

const char* kTensorsJob = R"(
model: {name: mlp, hidden: 32}
data: {name: tensors, path: %s, batch_size: 8}
train: {steps: 2, eval_every: 0}
parallel: {workers: 1}
comm: {timeout_s: 20}
)";

const char* kImagesJob = R"(
model: {name: cnn}
data: {name: images, path: images, size: 28x28, channels: 1, batch_size: 1%s}
train: {steps: 2, eval_every: 0}
parallel: {workers: 1}
comm: {timeout_s: 20}
)";

std::string job_text(const char* format, const std::string& arg) {
  char text[512];
  std::snprintf(text, sizeof(text), format, arg.c_str());
  return text;
}

TEST_F(Bombs, ATensorStatingMoreElementsThanItsStorageIsRefused) {
  write_tensors();
  expect_bomb_refused(
      "expanded", job_text(kTensorsJob, "expanded.pt"),
      {"expanded.pt", "'x' of shape [1000000, 1, 28, 28]", "784000000 elements", "holds 784"});
  expect_bomb_refused("expanded_1e9", job_text(kTensorsJob, "expanded_1e9.pt"),
                      {"expanded_1e9.pt", "784000000000 elements", "holds 784"});
}

TEST_F(Bombs, OneHugeLabelDoesNotBecomeMillionsOfClasses) {
  write_tensors();
  expect_bomb_refused("label", job_text(kTensorsJob, "label.pt"),
                      {"label.pt", "label 20000000", "data.num_classes"});
}

TEST_F(Bombs, AnImageStatingMorePixelsThanTheLimitIsRefusedByItsHeader) {
  using krab::data::testing::jpeg_stating;
  using krab::data::testing::png_stating;
  const std::string png = image_folder("bomb.png", png_stating(65535, 65535, true));
  ASSERT_LT(fs::file_size(dir_ / png), 100u);
  expect_bomb_refused("png", job_text(kImagesJob, ""),
                      {png, "65535x65535", "data.max_pixels (16777216)"});
  fs::remove(dir_ / png);
  const std::string jpeg = image_folder("bomb.jpg", jpeg_stating(30000, 30000));
  ASSERT_LT(fs::file_size(dir_ / jpeg), 1024u);
  expect_bomb_refused("jpeg", job_text(kImagesJob, ""), {jpeg, "30000x30000", "data.max_pixels"});
  // The key sets the limit: a real 64 x 64 image over a limit of 4000 pixels.
  fs::remove(dir_ / jpeg);
  const std::string real = image_folder("real.png", "");
  krab::data::testing::write_png((dir_ / real).string(), 64, 64, 1,
                                 krab::data::testing::make_pixels(1, 64, 64, 1));
  expect_bomb_refused("limit", job_text(kImagesJob, ", max_pixels: 4000"),
                      {real, "64x64", "data.max_pixels (4000)"});
}

}  // namespace
