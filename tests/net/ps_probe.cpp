// An outsider's client for tests/net/exposure.sh: for each HOST:PORT given, tries what an
// attacker without the job secret tried in issue 17 — pull the parameters, push a gradient of
// NaNs, call Finish — and prints one line per call. A call counts as refused when it could not
// reach a parameter server at all (nothing there, or not gRPC) or the server said the job secret
// was missing; anything else (an answer, a refusal that needed the request to be read) is
// ANSWERED.
//
//   ps_probe HOST:PORT...    exit 0: every call refused; 1: something answered.
// The last line says how many ports refused for want of the secret ("secret-refusals N"): the
// script checks that it reached the parameter servers.
//
//   ps_probe --store-has HOST:PORT KEY    prints "present" or "absent": what a TCPStore client
//                                         without the secret sees of KEY (issue 17 item 3).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/errors.h"
#include "sync/param_server.h"

namespace {

using namespace std::chrono_literals;

enum class Outcome { kUnreachable, kNeedsSecret, kAnswered };

template <typename F>
Outcome attempt(const std::string& address, const char* what, F&& call) {
  std::string how;
  Outcome out = Outcome::kAnswered;
  try {
    call();
    how = "answered";
  } catch (const krab::PeerLost& e) {
    out = Outcome::kUnreachable;
    how = "unreachable";
  } catch (const krab::Timeout& e) {
    out = Outcome::kUnreachable;
    how = "no answer";
  } catch (const std::exception& e) {
    how = e.what();
    if (how.find("job secret is missing or wrong") != std::string::npos)
      out = Outcome::kNeedsSecret;
  }
  std::printf("%s %s: %s: %s\n", address.c_str(), what,
              out == Outcome::kAnswered ? "ANSWERED" : "refused", how.c_str());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--store-has") {
    const std::string at = argv[2];
    const auto colon = at.rfind(':');
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(std::stoi(at.substr(colon + 1)));
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::seconds(5);
    c10d::TCPStore store(at.substr(0, colon), opts);
    std::printf("%s\n", store.check({argv[3]}) ? "present" : "absent");
    return 0;
  }
  constexpr int64_t kNumel = 1000;  // the outsider does not know the model's size
  int answered = 0, secret_refusals = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string address = argv[i];
    at::Tensor params = at::empty({kNumel}, at::kFloat);
    const Outcome pull = attempt(address, "pull", [&] {
      krab::sync::PsClient c({address}, 0, kNumel, 2000ms);
      c.pull(params);
    });
    const Outcome push = attempt(address, "NaN push", [&] {
      krab::sync::PsClient c({address}, 0, kNumel, 2000ms);
      c.push_pull(at::full({kNumel}, NAN), params);
    });
    const Outcome finish =
        attempt(address, "Finish", [&] { krab::sync::finish_shard(address, 2000ms); });
    for (Outcome o : {pull, push, finish}) answered += o == Outcome::kAnswered;
    secret_refusals += pull == Outcome::kNeedsSecret && push == Outcome::kNeedsSecret &&
                       finish == Outcome::kNeedsSecret;
  }
  std::printf("secret-refusals %d\n", secret_refusals);
  return answered == 0 ? 0 : 1;
}
