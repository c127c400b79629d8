// What the end-to-end tests of the krab binary share: running it (in the foreground with a
// time limit, or in the background), a fixture with its own temporary directory, a small job,
// and checks on exit codes and child processes.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"
#include "core/fs.h"

namespace krab::cli_test {

namespace fs = std::filesystem;

inline const std::string kKrab = std::string(KRAB_BINARY_DIR) + "/bin/krab";

struct Result {
  int code = -1;
  std::string output;
};

// Runs a shell command (stderr merged), bounded by `timeout` seconds.
inline Result run(const std::string& cmd, int timeout = 300) {
  Result r;
  std::string quoted;  // single-quote the command for sh -c
  for (char c : cmd) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string full =
      "timeout -k 5 " + std::to_string(timeout) + " sh -c '" + quoted + "' 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::string krab(const std::string& args) {
    return "cd " + dir_.string() + " && " + kKrab + " " + args;
  }
  fs::path dir_;
};

inline const char* kSmallJob = R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 2048, batch_size: 32}
train: {steps: 20, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 2}
comm: {timeout_s: 20}
)";

inline void expect_refused(const Result& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Segmentation"), std::string::npos) << r.output;
}

// A port nobody listens on right now (bound, then released).
inline int free_port() {
  krab::comm::StoreServer probe("127.0.0.1", 0, std::chrono::seconds(5));
  return probe.port();
}

inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) +
                   "/children");
  pid_t p;
  while (in >> p) out.push_back(p);
  return out;
}

inline std::string environ_of(pid_t pid) {
  std::string env = krab::core::read_file("/proc/" + std::to_string(pid) + "/environ");
  for (char& c : env)
    if (c == '\0') c = '\n';
  return "\n" + env;
}

// Starts `krab ARGS...` in `dir` in the background, stderr to `log`.
inline pid_t start_krab(const fs::path& dir, const std::string& log,
                        std::vector<std::string> args) {
  args.insert(args.begin(), kKrab);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::chdir(dir.c_str());
    std::freopen(log.c_str(), "w", stderr);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(kKrab.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits up to `seconds` for `pid` to exit; false (and `pid` killed) if it did not.
inline bool wait_exit(pid_t pid, int seconds, int& status) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  pid_t got = 0;
  while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (got != 0) return true;
  ::kill(pid, SIGKILL);
  return false;
}

// model.pt (a name -> tensor dictionary written by krab) read back, as Python's torch.load would.
inline std::map<std::string, at::Tensor> load_model_pt(const std::string& path) {
  const std::string bytes = krab::core::read_file(path);
  auto iv = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : iv.toGenericDict()) out[kv.key().toStringRef()] = kv.value().toTensor();
  return out;
}

// The largest relative difference ||a_k - b_k|| / ||a_k|| over the tensors of `a` (1e9, and a
// failed expectation, when `b` lacks one): how far two runs' model.pt files are apart.
inline double max_rel_diff(const std::map<std::string, at::Tensor>& a,
                           const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [k, t] : a) {
    EXPECT_TRUE(b.count(k)) << k;
    if (!b.count(k)) return 1e9;
    const double diff = (t - b.at(k)).norm().item<double>();
    const double scale = std::max(t.norm().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace krab::cli_test
