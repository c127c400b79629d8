// Traffic: what the collectives put on the wire, as numbers a planner can use.
//
// Every backend counts its payload with the same model, the bandwidth-optimal one, so a report
// or a planner compares backends and strategies on one scale. W = group size; the result is
// what one rank sends for one op:
//
//   op              payload_bytes means             bytes one rank sends
//   allreduce       the tensor, N                   2 (W-1)/W · N, rounded down: a ring
//                                                   reduce-scatter then a ring all-gather, each
//                                                   moving W-1 of the W segments
//   allgather       one rank's input, n             (W-1) · n: a ring passes every other
//                                                   rank's block on once
//   reduce_scatter  the whole input, N = W · out    (W-1)/W · N = (W-1) · out: every chunk but
//                                                   one's own leaves once
//   alltoall        the whole input, N              (W-1)/W · N: every chunk but one's own
//   broadcast       the tensor, N                   (W-1) · N at the root, 0 elsewhere: what
//                                                   any spanning tree moves in total, so the
//                                                   sum over ranks is exact whatever tree the
//                                                   backend picks. wire_bytes() gives the
//                                                   root's figure.
//   send            the tensor, N                   N
//   recv            the tensor, N                   0 (counted at the sender)
//   barrier         -                               0
//
// A backend may run another algorithm (MPI picks recursive doubling for small messages); the
// meter still counts this model. Empty tensors and groups of one send 0, which the formulas
// give without a special case. Control traffic (rendezvous, heartbeats, debug checks) is not
// payload and is not counted.
#pragma once

#include <array>
#include <cstdint>

namespace krab::comm {

// Kinds of operations, for the traffic meter and for error messages.
enum class OpKind : int {
  kAllreduce = 0,
  kAllgather,
  kReduceScatter,
  kAlltoall,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kCount
};
const char* op_name(OpKind op);

// Bytes one rank of a `world_size` group sends for one `op` on `payload_bytes`, as the table
// above defines them (broadcast: at the root). This is exactly what Communicator::traffic()
// records. Pure; world_size must be >= 1.
uint64_t wire_bytes(OpKind op, uint64_t payload_bytes, int world_size);

// Payload bytes and op counts, per op kind. Plain value; safe to copy.
struct TrafficStats {
  std::array<uint64_t, static_cast<int>(OpKind::kCount)> bytes_sent{};
  std::array<uint64_t, static_cast<int>(OpKind::kCount)> ops{};
  uint64_t total_bytes_sent() const;
  void add(OpKind op, uint64_t bytes);
};

}  // namespace krab::comm
