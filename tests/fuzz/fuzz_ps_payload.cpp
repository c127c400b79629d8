// Fuzzes the parameter server's handling of what workers and servers send, after gRPC.
//
// First byte even: a session of Step requests from two workers against one fresh shard of 4
// parameters (the handler's code, serve_step()); the rest is a sequence of requests, each a
// 1-byte length then that many bytes of serialised StepRequest. The shard never waits in
// a fuzz run: the calls are "cancelled" as soon as they would block. The staleness bound
// comes from the first byte (-1, 0 or 1). First byte odd: the rest is a serialised FinishReply
// for the chief (decode_finish_reply()).
#include <torch/torch.h>

#include "fuzz/fuzz_util.h"
#include "sync/param_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace krab::sync;
  if (data[0] & 1) {
    const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
    krab::fuzz::refusals_only([&] {
      const FinalShard f = decode_finish_reply(bytes, "parameter server 0");
      krab::fuzz::check(f.values.dim() == 1 && f.values.scalar_type() == at::kFloat,
                        "the final shard is not a 1-D float tensor");
    });
    return 0;
  }
  ShardOptions o;
  o.workers = 2;
  o.max_staleness = static_cast<int>((data[0] >> 1) % 3) - 1;
  o.aggregate = (data[0] & 8) ? 2 : 1;
  o.extrapolate = (data[0] & 16) != 0;
  o.issue_tickets = true;
  o.total_pushes = 16;
  o.lr_at = [](int64_t) { return 0.1; };
  ShardState shard(o, torch::zeros({4}), [](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  });
  const auto cancelled = [] { return true; };
  size_t at = 1;
  while (at < size) {
    const size_t n = std::min<size_t>(data[at], size - at - 1);
    const std::string request(reinterpret_cast<const char*>(data) + at + 1, n);
    at += 1 + n;
    krab::fuzz::refusals_only([&] { serve_step(shard, request, cancelled); });
  }
  const at::Tensor v = shard.values();
  krab::fuzz::check(v.numel() == 4, "the shard changed size");
  shard.stats();
  return 0;
}
