// Fuzzes what the federated transport makes of the bytes a peer sent, after gRPC: the first
// byte picks the side. 0: a client decoding the server's Task (decode_task); 1 and 2: the
// server decoding a client's TaskResult for a plain or a secure fit (decode_fit_result).
// A decoded update must be whole float32 values; a task's kind must be one the client knows.
#include "federated/transport_payload.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace krab::federated;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int side = data[0] % 3;
  krab::fuzz::refusals_only([&] {
    if (side == 0) {
      const RemoteTask t = decode_task(bytes);
      krab::fuzz::check(t.kind >= RemoteTask::kWait && t.kind <= RemoteTask::kDone,
                        "decode_task returned a kind the server cannot send");
      if (t.kind == RemoteTask::kFit)
        krab::fuzz::check(t.fit.global.dim() == 1 && t.fit.global.scalar_type() == at::kFloat,
                          "the global model is not a 1-D float tensor");
      if (t.kind == RemoteTask::kSecAgg)
        krab::fuzz::check(
            t.secagg.stage >= SecAggRequest::kShareKeys && t.secagg.stage <= SecAggRequest::kUnmask,
            "a secure-aggregation stage outside 1..3");
    } else {
      const FitReply r = decode_fit_result(bytes, side == 2, "client 'fuzz'");
      if (side == 1)
        krab::fuzz::check(r.update.dim() == 1 && r.update.scalar_type() == at::kFloat,
                          "the update is not a 1-D float tensor");
    }
  });
  return 0;
}
