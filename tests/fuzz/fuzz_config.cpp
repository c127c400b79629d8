// Fuzzes the job file parser and --set: Config::parse(yaml, "job.yaml", overrides).
//
// Input: the YAML text, then each override after a NUL byte ("train:\n  epochs: 2\0lr=1").
// A job that parses must survive its own round trip, since to_yaml() is what the federated
// server sends its clients: parse(to_yaml()) gives the same values.
#include <string>
#include <vector>

#include "core/config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  while (nul != std::string::npos) {
    const size_t next = input.find('\0', nul + 1);
    overrides.push_back(input.substr(nul + 1, next == std::string::npos ? next : next - nul - 1));
    nul = next;
  }
  krab::fuzz::refusals_only([&] {
    const krab::core::Config config = krab::core::Config::parse(yaml, "job.yaml", overrides);
    config.to_json();
    const std::string again = config.to_yaml();
    krab::core::Config reparsed;
    try {
      reparsed = krab::core::Config::parse(again, "to_yaml()");
    } catch (const krab::Error& e) {
      krab::fuzz::finding(std::string("to_yaml() of a valid job does not parse: ") + e.what() +
                          "\n" + again);
    }
    if (reparsed != config) {
      const auto diff = nlohmann::json::diff(config.to_json(), reparsed.to_json());
      krab::fuzz::finding("parse(to_yaml()) differs from the job: " + diff.dump() + "\n" + again);
    }
  });
  return 0;
}
