// MPI backend: collectives through the MPI library the job was launched with (Open MPI here).
//
// Use it when the job is started by `mpirun`/`mpiexec` (mpi_launched() says so): MPI's launcher
// already knows every rank's address, so there is no rendezvous store. The group is
// MPI_COMM_WORLD, duplicated so krab's traffic never matches the application's own messages.
//
// Every op is asynchronous: it starts one MPI-3 nonblocking call (MPI_Iallreduce,
// MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall, MPI_Ibcast, MPI_Isend/MPI_Irecv, MPI_Ibarrier)
// and returns a Work whose wait() polls MPI_Test until the op completes or Options::timeout
// has passed since wait() was first called. MPI makes progress only inside MPI calls, so an op
// advances while somebody waits on it, tests it (is_completed()), or starts another op; there
// is no progress thread, and compute/communication overlap is what the MPI library gives.
//
// What goes on the wire (payload per rank, counted by the traffic meter; N = tensor bytes,
// W = group size). The meter counts the bandwidth-optimal model, the same one the Gloo backend
// documents, not whatever algorithm Open MPI picks for a given message size (it may choose
// recursive doubling for small messages):
//   allreduce       ring (reduce-scatter then all-gather): 2 (W-1)/W · N, rounded down
//   allgather       ring: (W-1) · n, n = one rank's input bytes
//   reduce_scatter  ring: (W-1)/W · N = (W-1) · output bytes
//   alltoall        (W-1)/W · N: every chunk but one's own
//   broadcast       counted at the root as (W-1) · N, 0 elsewhere: what any spanning tree moves
//                   in total, so the sum over ranks is exact whatever tree MPI picks
//   send            N; recv 0 (counted at the sender, op count still 1); barrier 0
// Empty tensors and groups of one complete at once and send nothing, but still take a
// sequence number.
//
// Data types. Data movement (allgather, broadcast, send/recv) accepts every dtype. Reductions
// accept float32, float64, int8, uint8, int16, int32, int64 (native MPI types), and bfloat16
// and float16 through krab's own MPI_Ops (each partial result is rounded to the 16-bit type,
// as MPI reduces pairwise); any other dtype -> krab::NotSupported naming it. ReduceOp::kAvg
// sums, then divides by size() when the op completes; it needs a floating dtype. One op moves
// at most 2^31-1 elements (MPI counts are int); larger -> krab::NotSupported.
//
// Failures.
//  * Timeout: wait() throws krab::Timeout "<op> #<seq> on rank <r> timed out after <t> s
//    (backend mpi) ...". Sequence numbers count collectives per communicator; send/recv name
//    the peer, the tag and the last collective's number instead. Unlike Gloo, the message cannot
//    name the ranks that never joined: MPI offers no side channel to ask them.
//  * MPI cannot cancel a collective that is in flight, so after a timeout the communicator is
//    poisoned: every later op on it throws krab::Error saying why (groups split from it earlier
//    are separate MPI communicators and stay usable). The abandoned buffers are kept alive
//    until the process exits.
//  * A peer that dies is normally noticed by the MPI launcher, which kills the whole job;
//    krab::PeerLost is never thrown by this backend. Errors MPI does return (the communicator
//    uses MPI_ERRORS_RETURN) become krab::Error naming the op and the MPI error string.
//  * At process exit MPI_Finalize runs (from a static guard) unless an op is still pending
//    (e.g. after a timeout): then the job is ended with MPI_Abort(1) instead, because
//    MPI_Finalize would wait for a peer that is not coming.
//
// Blocking steps that MPI cannot bound: MPI_Init_thread (it waits for the launcher). Building
// the group uses MPI_Comm_idup and split() first exchanges (color, key) with MPI_Iallgather,
// both polled under Options::timeout, so the blocking MPI_Comm_split that follows only runs
// once every rank is known to have arrived.
//
// Options::debug_checks: before each collective every rank all-gathers a short description of
// the op (kind, dtype, shape) and all of them throw krab::Error "collective mismatch at #<seq>:
// ..." if any differ; the mismatching op is then not started, so the group stays usable.
//
// Process-wide MPI state (initialisation, the lock, krab's datatypes and ops, requests left
// pending) lives in mpi_runtime.h, which only this folder includes.
//
// Threading. MPI is initialised with MPI_THREAD_SERIALIZED, and krab holds one process-wide
// mutex around every MPI call. The Communicator contract lets Work handles be waited on from any
// thread while the training thread issues the next op, so calls do come from several threads,
// but never at once: each MPI call made here is a short nonblocking one (the mutex is released
// between polls), so the lock costs microseconds, and SERIALIZED keeps Open MPI on its fast path
// (MPI_THREAD_MULTIPLE adds internal locking to every call and is not supported by every
// transport). If the application initialised MPI itself with less than SERIALIZED,
// make_mpi_communicator() throws krab::NotSupported.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.h"

namespace krab::comm {

class MpiCommunicator : public Communicator {
 public:
  // State shared by a communicator and the Work handles it returns: the MPI communicator and
  // the poisoned flag. Defined in the .cpp, so that this header does not need mpi.h.
  struct Group;

  // Use make_mpi_communicator(); `group` owns an MPI communicator already set up.
  MpiCommunicator(std::shared_ptr<Group> group, const Options& options);
  // Frees the MPI communicator (unless MPI is already finalised). Ops still in flight keep
  // their buffers alive and finish, or are abandoned at exit.
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t generation() const override { return 0; }
  std::string backend() const override { return "mpi"; }

  WorkPtr allreduce(at::Tensor& tensor, ReduceOp op) override;
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output) override;
  WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  WorkPtr alltoall(const at::Tensor& input, at::Tensor& output) override;
  WorkPtr broadcast(at::Tensor& tensor, int root) override;
  WorkPtr send(const at::Tensor& tensor, int dst, int tag) override;
  WorkPtr recv(at::Tensor& tensor, int src, int tag) override;
  WorkPtr barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  TrafficStats traffic() const override;

 private:
  // Takes collective number seq_ (after the communicator was checked usable) and runs the
  // debug check if enabled. Returns the sequence number.
  int64_t begin(OpKind op, const at::Tensor* tensor);
  void count(OpKind op, uint64_t bytes);
  // Throws krab::Error if an earlier op timed out.
  void check_usable() const;

  std::shared_ptr<Group> group_;
  Options options_;
  int rank_;
  int size_;
  int64_t seq_ = 0;
  mutable std::mutex traffic_mu_;
  TrafficStats traffic_;
};

// Initialises MPI on first use (MPI_Init_thread, MPI_THREAD_SERIALIZED) and returns a group over
// all ranks of the job: MPI_COMM_WORLD duplicated. Each call builds a new, independent group
// (collective over all ranks). Throws krab::Timeout if not every rank arrives within
// options.timeout, krab::NotSupported if MPI was initialised elsewhere with too low a thread
// level, krab::Error if MPI was already finalised.
std::unique_ptr<Communicator> make_mpi_communicator(const Options& options);

// True when this process was started by Open MPI's launcher (OMPI_COMM_WORLD_SIZE is set).
bool mpi_launched();

// Ends every rank of the job now (MPI_Abort on MPI_COMM_WORLD) with `exit_code`, after printing
// `why` to stderr. For a rank that cannot continue and must not wait in MPI_Finalize for peers
// stuck in a collective. If MPI is not initialised, it just exits the process.
[[noreturn]] void mpi_abort_job(int exit_code, const std::string& why);

}  // namespace krab::comm
