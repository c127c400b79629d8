#include "comm/communicator.h"

namespace krab::comm {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kCount: break;
  }
  return "unknown";
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
