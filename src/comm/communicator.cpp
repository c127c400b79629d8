#include "comm/communicator.h"

#include "core/errors.h"

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

void check_alltoall_sizes(const at::Tensor& input, const at::Tensor& output, int size) {
  KRAB_CHECK_ARG(output.numel() == input.numel(), "alltoall output must have ", input.numel(),
                 " elements like the input, got ", output.numel());
  KRAB_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "alltoall output dtype must match the input's");
  KRAB_CHECK_ARG(input.numel() % size == 0, "alltoall input has ", input.numel(),
                 " elements, not a multiple of the group size ", size);
}

}  // namespace krab::comm
