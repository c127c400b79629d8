// Fuzzes the inspection of TorchScript files (models/script_inspection.h), which reads bytes
// someone else wrote before LibTorch does. The first byte picks what the rest is: even, one
// source record for scan_script_source (the tokenizer and the reference scan); odd, a whole
// archive for inspect_torchscript_bytes (the zip walk, the pickle walks, the scan of every
// source record).
// A finding is a crash, an exception that is not a krab::Error, a message quoting raw bytes, or
// a ScriptFinding whose line is not in the source or whose text quotes raw bytes.
#include <algorithm>
#include <string>

#include "fuzz/fuzz_util.h"
#include "models/script_inspection.h"
#include "models/script_scan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    const auto f = krab::models::scan_script_source(rest);
    if (!f) return 0;
    const int lines = 1 + static_cast<int>(std::count(rest.begin(), rest.end(), '\n'));
    krab::fuzz::check(f->line >= 1 && f->line <= lines, "a finding's line is not in the source");
    krab::fuzz::check_printable_message(f->what.c_str());
    return 0;
  }
  krab::fuzz::refusals_only([&] { krab::models::inspect_torchscript_bytes(rest, "fuzzed"); });
  return 0;
}
