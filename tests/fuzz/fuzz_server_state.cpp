// Fuzzes the federated server's checkpoint, load_server_state(path, runner, signature), into a
// FedAdam runner over two parameters.
//
// As for fuzz_checkpoint, the first byte picks a mode so the fuzzer gets past the CRC: odd, the
// rest is the whole file; even, the rest is the payload and a valid header is put in front of
// it. A file that loads must leave a runner that can report its history; one that is refused
// must leave the runner as it was. The payload is a record (core/record.h), read without
// LibTorch's parsers, so this target runs without -fork: any crash is a finding.
#include <torch/torch.h>
#include <zlib.h>

#include "federated/server_state.h"
#include "fuzz/fuzz_util.h"

namespace {

std::string with_header(const uint8_t* payload, size_t n) {
  std::string out("KRABFLS2", 8);
  const uint64_t length = n;
  const uint32_t crc =
      static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), payload, static_cast<uInt>(n)));
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  out.append(reinterpret_cast<const char*>(payload), n);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace krab::federated;
  const std::string bytes = (data[0] & 1)
                                ? std::string(reinterpret_cast<const char*>(data) + 1, size - 1)
                                : with_header(data + 1, size - 1);
  const std::string path = krab::fuzz::write_scratch(
      "fl-state.krab", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  FederatedOptions o;
  o.fraction = 1.0;
  o.min_clients = 1;
  o.strategy = "fedadam";
  RoundRunner runner(o, torch::zeros({2}), false);
  bool loaded = false;
  krab::fuzz::refusals_only([&] { loaded = load_server_state(path, runner, "sig"); });
  if (loaded) {
    krab::fuzz::refusals_only([&] {
      nlohmann::json report;
      add_history(report, runner);
      report.dump();  // what `krab fl-server` writes next
    });
  } else {
    krab::fuzz::check(runner.rounds_done() == 0 && runner.history().empty() &&
                          torch::equal(runner.global(), torch::zeros({2})),
                      "a refused state file changed the runner");
  }
  return 0;
}
