// The Communicator: how krab workers talk.
//
// A Communicator is one fixed group of `size()` processes built at one membership
// `generation()`. Groups never change in place: when membership changes, a new Communicator is
// built under a new generation (see comm/rendezvous.h). Every backend (Gloo, MPI, ...) lives in
// comm/backends/<name>/ behind make_communicator() and passes the same test suite.
//
// Operations are asynchronous: each returns a Work handle; nothing is guaranteed about the
// tensors until wait() returns. All ranks must issue the same collectives in the same order
// (as with every collective library); each collective carries a sequence number, and with
// Options::debug_checks every rank verifies that the others called the same op with the same
// shape at that sequence number, and reports the first mismatch.
//
// Failure contract (the "no silent hangs" rule):
//  * A collective that does not complete within Options::timeout throws krab::Timeout from
//    wait(), on every live rank, naming the op, its sequence number and the ranks that never
//    joined it.
//  * A peer that dies makes wait() throw krab::PeerLost naming the dead rank(s), within the
//    timeout.
//
// Traffic: every payload byte a backend puts on the wire is counted in traffic(), per op
// kind, from the algorithm the backend runs (documented per backend). Control traffic
// (rendezvous, heartbeats) is not payload and is not counted.
//
// Thread safety: a Communicator is used from one thread at a time (the training thread), and
// the Work handles it returns may be waited on from any thread. Backends run their own
// progress threads internally.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace krab::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

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

// Payload bytes and op counts, per op kind. Plain value; safe to copy.
struct TrafficStats {
  std::array<uint64_t, static_cast<int>(OpKind::kCount)> bytes_sent{};
  std::array<uint64_t, static_cast<int>(OpKind::kCount)> ops{};
  uint64_t total_bytes_sent() const;
  void add(OpKind op, uint64_t bytes);
};

// Handle to an operation in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completed. Throws the operation's error (Timeout, PeerLost,
  // Error) if it failed; calling wait() again rethrows the same error.
  virtual void wait() = 0;
  // True once the operation finished, successfully or not. Never blocks.
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

struct Options {
  // Longest any single operation may take before it fails on every live rank.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Check that all ranks issue the same op with the same shapes (one small extra exchange
  // per op through the store; for debugging, not for production runs).
  bool debug_checks = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Membership generation this group was built at (0 for the first).
  virtual int64_t generation() const = 0;
  // Backend name: "gloo", "mpi", ...
  virtual std::string backend() const = 0;

  // In-place reduction of `tensor` across all ranks. Contiguous CPU tensor, same shape and
  // dtype on every rank. kAvg divides by size() after summing.
  virtual WorkPtr allreduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;

  // `output` (contiguous, numel = size() * input.numel(), same dtype) receives every rank's
  // `input`, rank r's at offset r * input.numel().
  virtual WorkPtr allgather(const at::Tensor& input, at::Tensor& output) = 0;

  // Sums `input` (numel = size() * output.numel()) across ranks and leaves chunk r of the
  // result in rank r's `output`.
  virtual WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                 ReduceOp op = ReduceOp::kSum) = 0;

  // `input` is size() equal chunks; chunk j goes to rank j, which receives it as chunk r (r =
  // this rank) of its `output` (same numel and dtype as `input`, must not overlap it). Any
  // dtype: compressors move encoded bytes with it.
  virtual WorkPtr alltoall(const at::Tensor& input, at::Tensor& output) = 0;

  // Copies root's `tensor` into every other rank's `tensor`.
  virtual WorkPtr broadcast(at::Tensor& tensor, int root) = 0;

  // Point-to-point. The receiver must pass a tensor of the same numel and dtype. Messages
  // between one pair of ranks with one tag arrive in order.
  virtual WorkPtr send(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int src, int tag = 0) = 0;

  virtual WorkPtr barrier() = 0;

  // Collective over all ranks: ranks passing the same `color` form a new group, ordered by
  // (key, rank). A negative color returns nullptr (the rank joins no group). The new group
  // shares this one's generation, options and traffic accounting scope.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Payload counted so far by this communicator (sub-groups count on their own).
  virtual TrafficStats traffic() const = 0;
};

// For backends: the argument checks every alltoall shares (output numel and dtype equal the
// input's, numel a multiple of `size`); throws krab::InvalidArgument.
void check_alltoall_sizes(const at::Tensor& input, const at::Tensor& output, int size);

}  // namespace krab::comm
