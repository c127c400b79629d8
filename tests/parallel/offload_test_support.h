// What the disk-offload tests (stages 1-2 and stage 3) share: a scratch directory per test and
// the resident size of one mapping.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace krab::parallel::zero::zero_test {

// An empty directory named after the running test, removed with everything in it at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           ("krab-offload-" + std::to_string(::getpid()) + "-" + test->test_suite_name() + "-" +
            test->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Kilobytes of the mapping that starts at `begin` resident in this process (/proc/self/smaps's
// Rss); -1 when no mapping starts there.
inline int64_t resident_kb(const void* begin) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    if (line.find('-') != std::string::npos && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find(':') > line.find(' ')) {
      inside = std::stoull(line.substr(0, line.find('-')), nullptr, 16) ==
               reinterpret_cast<uintptr_t>(begin);
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      return std::stoll(line.substr(4));
    }
  }
  return -1;
}

}  // namespace krab::parallel::zero::zero_test
