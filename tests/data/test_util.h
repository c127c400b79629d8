// Helpers shared by the data tests: temporary directories and exception-message checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>

namespace krab::data::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("krab_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs `fn`, expects it to throw exactly E (or a subclass) whose message contains every one
// of `parts`.
template <typename E>
void expect_throw_containing(const std::function<void()>& fn,
                             std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos)
          << "message '" << what << "' lacks '" << part << "'";
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

}  // namespace krab::data::testing
