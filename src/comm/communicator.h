// The Communicator: how krab workers talk.
//
// A Communicator is one fixed group of `size()` processes built at one membership
// `generation()`. Groups never change in place: when membership changes, a new Communicator is
// built under a new generation (see comm/store.h: each generation's keys live under their own
// prefix). Every backend (Gloo, MPI, ...) lives in comm/backends/<name>/ behind
// make_communicator() and passes the same test suite.
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
// Traffic: every payload byte an op puts on the wire is counted in traffic(), per op kind, with
// the model of comm/traffic.h (wire_bytes()), the same for every backend. Control traffic
// (rendezvous, heartbeats) is not payload and is not counted.
// Collectives on empty tensors and in groups of one complete at once and send nothing, but still
// take a sequence number (so every rank's numbering stays the same).
//
// For backend authors: the public calls below are not virtual. This class runs the frame every
// op shares, once for all backends, in this order: the argument checks (InvalidArgument before
// anything is counted or sent), the backend's own checks (do_check), the sequence number, the
// backend's notice that the op starts (do_enter), the debug check (do_exchange), the traffic
// count, the trivial cases (empty tensors, groups of one), and only then the backend's do_*
// hook, which just starts the op on its library. send/recv skip the sequence number, the
// debug check and the trivial cases.
//
// Thread safety: a Communicator is used from one thread at a time (the training thread), and
// the Work handles it returns may be waited on from any thread. Backends run their own
// progress threads internally.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/traffic.h"

namespace krab::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

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
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Membership generation this group was built at (0 for the first).
  int64_t generation() const { return generation_; }
  // Backend name: "gloo", "mpi", ...
  virtual std::string backend() const = 0;

  // In-place reduction of `tensor` across all ranks. Contiguous CPU tensor, same shape and
  // dtype on every rank. kAvg divides by size() after summing.
  WorkPtr allreduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  // `output` (contiguous, numel = size() * input.numel(), same dtype) receives every rank's
  // `input`, rank r's at offset r * input.numel().
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output);

  // Sums `input` (numel = size() * output.numel()) across ranks and leaves chunk r of the
  // result in rank r's `output`.
  WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::kSum);

  // `input` is size() equal chunks; chunk j goes to rank j, which receives it as chunk r (r =
  // this rank) of its `output` (same numel and dtype as `input`, must not overlap it). Any
  // dtype: compressors move encoded bytes with it.
  WorkPtr alltoall(const at::Tensor& input, at::Tensor& output);

  // Copies root's `tensor` into every other rank's `tensor`.
  WorkPtr broadcast(at::Tensor& tensor, int root);

  // Point-to-point. The receiver must pass a tensor of the same numel and dtype. Messages
  // between one pair of ranks with one tag arrive in order. They take no sequence number.
  WorkPtr send(const at::Tensor& tensor, int dst, int tag = 0);
  WorkPtr recv(at::Tensor& tensor, int src, int tag = 0);

  WorkPtr barrier();

  // Collective over all ranks: ranks passing the same `color` form a new group, ordered by
  // (key, rank). A negative color returns nullptr (the rank joins no group). The new group
  // shares this one's generation, options and traffic accounting scope.
  std::unique_ptr<Communicator> split(int color, int key);

  // Payload counted so far by this communicator (sub-groups count on their own).
  TrafficStats traffic() const;

 protected:
  // Checks rank, size and generation; throws InvalidArgument naming the bad one.
  Communicator(int rank, int size, int64_t generation, const Options& options);

  const Options& options() const { return options_; }

  // One call as the frame sees it, for the backend's own checks. Pointers are null where the
  // op has no such argument.
  struct Call {
    OpKind op;
    const at::Tensor* input = nullptr;   // the tensor sent or reduced in place
    const at::Tensor* output = nullptr;  // allgather, reduce_scatter, alltoall
    ReduceOp reduce = ReduceOp::kSum;    // allreduce, reduce_scatter
    int peer = -1;                       // broadcast root, send destination, recv source
    int tag = 0;                         // send, recv
  };

  // ---- hooks for backends ----

  // The backend's own checks after the common ones (dtypes it cannot move, sizes its library
  // cannot express, a group that can no longer be used). Throwing here leaves no trace: no
  // sequence number taken, nothing counted.
  virtual void do_check(const Call& call) const { (void)call; }
  // Collective number `seq` is about to start (e.g. a heartbeat record for error messages).
  virtual void do_enter(OpKind op, int64_t seq) {
    (void)op;
    (void)seq;
  }
  // Debug checks only (groups of two or more): publishes `mine`, this rank's description of
  // collective `seq` (an `op`), and returns every rank's, indexed by rank (a backend may
  // shorten them, the same way on every rank). The frame compares them and throws on a
  // mismatch.
  virtual std::vector<std::string> do_exchange(OpKind op, int64_t seq, const std::string& mine) = 0;

  // Start the op on the backend's library. Arguments are checked and the op is counted; the
  // collectives are never called with an empty tensor or a group of one (the frame finishes
  // those itself). `seq` is the collective's sequence number; send/recv get the number the
  // next collective will take, for their messages, and handle empty tensors themselves.
  virtual WorkPtr do_allreduce(at::Tensor& tensor, ReduceOp op, int64_t seq) = 0;
  virtual WorkPtr do_allgather(const at::Tensor& input, at::Tensor& output, int64_t seq) = 0;
  virtual WorkPtr do_reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                                    int64_t seq) = 0;
  virtual WorkPtr do_alltoall(const at::Tensor& input, at::Tensor& output, int64_t seq) = 0;
  virtual WorkPtr do_broadcast(at::Tensor& tensor, int root, int64_t seq) = 0;
  virtual WorkPtr do_send(const at::Tensor& tensor, int dst, int tag, int64_t seq) = 0;
  virtual WorkPtr do_recv(at::Tensor& tensor, int src, int tag, int64_t seq) = 0;
  virtual WorkPtr do_barrier(int64_t seq) = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key) = 0;

  // A handle that is already complete, without error.
  static WorkPtr completed();

 private:
  // The common tensor checks; `name` ("allreduce tensor") starts every message.
  void check_tensor(const at::Tensor& t, const char* name) const;
  // Takes the next sequence number for `call`, runs do_enter and the debug check, and counts
  // `bytes` of traffic. Returns the sequence number.
  int64_t begin(const Call& call, uint64_t bytes);
  void check_same_op(const Call& call, int64_t seq);
  void count(OpKind op, uint64_t bytes);
  void enter_point_to_point(OpKind op, const at::Tensor& tensor, int peer, int tag);

  const int rank_;
  const int size_;
  const int64_t generation_;
  const Options options_;
  int64_t seq_ = 0;  // the next collective's sequence number
  mutable std::mutex traffic_mu_;
  TrafficStats traffic_;
};

}  // namespace krab::comm
