#include "comm/traffic.h"

#include "core/errors.h"

namespace krab::comm {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAlltoall:
      return "alltoall";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kCount:
      break;
  }
  return "unknown";
}

uint64_t wire_bytes(OpKind op, uint64_t payload_bytes, int world_size) {
  KRAB_CHECK_ARG(world_size >= 1, "wire_bytes: world size must be >= 1, got ", world_size);
  const uint64_t w = static_cast<uint64_t>(world_size);
  const uint64_t n = payload_bytes;
  switch (op) {
    case OpKind::kAllreduce:
      return 2 * (w - 1) * n / w;
    case OpKind::kAllgather:
      return (w - 1) * n;
    case OpKind::kReduceScatter:
    case OpKind::kAlltoall:
      return (w - 1) * n / w;
    case OpKind::kBroadcast:
      return (w - 1) * n;
    case OpKind::kSend:
      return n;
    case OpKind::kRecv:
    case OpKind::kBarrier:
      return 0;
    case OpKind::kCount:
      break;
  }
  throw InvalidArgument(str_cat("wire_bytes: not an op kind: ", static_cast<int>(op)));
}

uint64_t TrafficStats::total_bytes_sent() const {
  uint64_t total = 0;
  for (uint64_t b : bytes_sent) total += b;
  return total;
}

void TrafficStats::add(OpKind op, uint64_t bytes) {
  bytes_sent[static_cast<int>(op)] += bytes;
  ops[static_cast<int>(op)] += 1;
}

}  // namespace krab::comm
