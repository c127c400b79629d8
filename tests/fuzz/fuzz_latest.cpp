// Fuzzes the run directory's `latest` pointer, latest_checkpoint(run_dir), whose text names
// the newest step directory. A run directory with step-00000001/state.krab in it is set up
// once; the input is the pointer file. What it returns must be a path inside the run
// directory with no NUL in it (a NUL would cut the path wherever it is used as a C string).
#include <filesystem>

#include "fuzz/fuzz_util.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string run_dir = [] {
    const auto dir = krab::fuzz::scratch_dir() / "run";
    std::filesystem::create_directories(dir / "step-00000001");
    krab::fuzz::write_scratch("run/step-00000001/state.krab", reinterpret_cast<const uint8_t*>("x"),
                              1);
    return dir.string();
  }();
  krab::fuzz::write_scratch("run/latest", data, size);
  krab::fuzz::refusals_only([&] {
    const auto path = krab::train::latest_checkpoint(run_dir);
    krab::fuzz::check(path.has_value(), "no checkpoint although `latest` exists");
    krab::fuzz::check(path->find('\0') == std::string::npos,
                      "latest_checkpoint returned a path with a NUL in it");
    krab::fuzz::check(path->rfind(run_dir + "/step-", 0) == 0 && std::filesystem::exists(*path),
                      "latest_checkpoint returned a path outside the run directory");
  });
  return 0;
}
