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
//  * A group can be abandoned (abort(), below: elastic membership). Every wait() that has not
//    returned yet then throws krab::MembershipChanged (a PeerLost), and every op started
//    afterwards returns a Work that fails the same way.
//
// Abort (elastic membership, issue 27). Groups never change in place, so when the membership
// changes the old group is given up: another thread (the one watching membership) calls
// abort(reason), the training thread's pending wait() throws MembershipChanged(reason), and the
// group is handed to the comm::Reaper (comm/reaper.h), which destroys it off the training
// thread while the next generation's group is built beside it. After abort():
//  - a new op still checks its arguments (a caller's mistake throws InvalidArgument as ever),
//    then returns at once a Work that is complete and whose wait() throws MembershipChanged.
//    It takes no sequence number, counts no traffic and reaches no backend; it never throws at
//    launch, so a gradient bucket launched from an autograd hook does not throw inside
//    backward — the error surfaces where the step waits. split() throws MembershipChanged.
//  - a wait() of an op started before (Gloo): with Options::abortable, it waits in 50 ms
//    slices and throws MembershipChanged within one slice of the abort; without it, a wait
//    that has not begun throws at once and one already blocked throws when its op ends
//    (completion or Timeout), so an aborted group's results are never returned. The MPI
//    backend's waits do not see abort() (elastic membership refuses MPI).
//  - the ops already started may still write into their tensors until the backend gives up on
//    them (Gloo: at its timeout): an aborted group's tensors must not be the model's state.
//  - abort() does not touch sub-groups made by split(); abort them too.
//
// Traffic: every payload byte an op puts on the wire is counted in traffic(), per op kind, with
// the model of comm/traffic.h (wire_bytes()), the same for every backend. Control traffic
// (rendezvous, heartbeats) is not payload and is not counted.
// Collectives on empty tensors and in groups of one complete at once and send nothing, but still
// take a sequence number (so every rank's numbering stays the same).
//
// For backend authors: the public calls below are not virtual. This class runs the frame every
// op shares, once for all backends, in this order: the argument checks (InvalidArgument before
// anything is counted or sent), the refusal of an aborted group (nothing after it runs), the
// backend's own checks (do_check), the sequence number, the backend's notice that the op
// starts (do_enter), the debug check (do_exchange), the traffic count, the trivial cases
// (empty tensors, groups of one), and only then the backend's do_* hook, which just starts the
// op on its library. send/recv skip the sequence number, the debug check and the trivial cases.
//
// Thread safety: a Communicator is used from one thread at a time (the training thread), and
// the Work handles it returns may be waited on from any thread. abort() and aborted() may be
// called from any thread at any time. Backends run their own progress threads internally.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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

// What a rank knows when one of its ops failed on an abortable group (Options::on_peer_error):
// its own place and the op, and the backend's words. It does not know which peer is at fault
// (Gloo names an address, not a rank); the elastic keeper does, from exits and heartbeats.
struct PeerError {
  int rank = 0;            // this rank, in the failed group
  int64_t generation = 0;  // the failed group's generation
  OpKind op = OpKind::kAllreduce;
  int64_t seq = 0;         // the op's sequence number
  bool timed_out = false;  // true: the op ran out of Options::timeout; false: a link broke
  std::string cause;       // the backend's message, first line
};

struct Options {
  // Longest any single operation may take before it fails on every live rank.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Check that all ranks issue the same op with the same shapes (one small extra exchange
  // per op through the store; for debugging, not for production runs).
  bool debug_checks = false;
  // Period of the group's heartbeat records (comm/peer_monitor.h: what names dead ranks in
  // errors, and what an elastic run's keeper watches: elastic.heartbeat_ms).
  std::chrono::milliseconds heartbeat{200};
  // Elastic membership (default off: nothing changes). wait() polls the op in short slices so
  // abort() ends it within one slice, and a failed op is not diagnosed (the diagnosis that
  // names dead ranks blocks 0.6-3 s reading heartbeats; the elastic keeper names them
  // instead): wait() calls on_peer_error, then throws PeerLost (a broken link) or Timeout. Gloo
  // only; the MPI backend ignores it.
  bool abortable = false;
  // With `abortable`: called on the waiting thread, once per failed op, before wait() throws
  // (so several times when several pending ops fail). Keep it short; it must not throw (an
  // exception from it is swallowed and named in the error wait() throws). Not called for
  // MembershipChanged: the group was given up on purpose.
  std::function<void(const PeerError&)> on_peer_error;
};

// The abort state of one group, shared with the Work handles it returned (which may outlive
// it). Backends read it; only Communicator::abort raises it. Thread-safe.
class AbortSignal {
 public:
  // True once raised; never false again.
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  // The first raise's reason ("" before any).
  std::string reason() const;
  // Raises the signal with `reason`; a later raise keeps the first reason and returns false.
  bool raise(const std::string& reason);
  // A MembershipChanged carrying reason(), to hand to a Work.
  std::exception_ptr error() const;

 private:
  mutable std::mutex mu_;
  std::string reason_;
  std::atomic<bool> raised_{false};
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

  // Abandons the group (see "Abort" above). Any thread, any time, idempotent: the first
  // reason is kept. Never blocks on the network.
  void abort(const std::string& reason);
  // True once abort() was called.
  bool aborted() const { return abort_->raised(); }
  // The longest one op may take (Options::timeout); the reaper's bound.
  std::chrono::milliseconds timeout() const { return options_.timeout; }

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
  // This group's abort state, for the backend's Work handles to share.
  const std::shared_ptr<AbortSignal>& abort_signal() const { return abort_; }

 private:
  // The common tensor checks; `name` ("allreduce tensor") starts every message.
  void check_tensor(const at::Tensor& t, const char* name) const;
  // Takes the next sequence number for `call`, runs do_enter and the debug check, and counts
  // `bytes` of traffic. Returns the sequence number.
  int64_t begin(const Call& call, uint64_t bytes);
  void check_same_op(const Call& call, int64_t seq);
  void count(OpKind op, uint64_t bytes);
  void check_point_to_point(OpKind op, const at::Tensor& tensor, int peer) const;
  void enter_point_to_point(OpKind op, const at::Tensor& tensor, int peer, int tag);
  // After abort(): a complete Work whose wait() throws MembershipChanged. nullptr before.
  WorkPtr refused() const;

  const int rank_;
  const int size_;
  const int64_t generation_;
  const Options options_;
  int64_t seq_ = 0;  // the next collective's sequence number
  mutable std::mutex traffic_mu_;
  TrafficStats traffic_;
  const std::shared_ptr<AbortSignal> abort_ = std::make_shared<AbortSignal>();
};

}  // namespace krab::comm
