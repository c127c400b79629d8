// MPI backend: collectives through the MPI library the job was launched with (Open MPI here).
//
// Use it when the job is started by `mpirun`/`mpiexec` (mpi_launched() says so): MPI's launcher
// already knows every rank's address, so there is no rendezvous store. The group is
// MPI_COMM_WORLD, duplicated so krab's traffic never matches the application's own messages.
//
// Every op is asynchronous: it starts one MPI-3 nonblocking call (MPI_Iallreduce,
// MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall, MPI_Ibcast, MPI_Isend/MPI_Irecv,
// MPI_Ibarrier) and returns a Work whose wait() polls MPI_Test until the op completes or
// Options::timeout has passed since wait() was first called. MPI makes progress only inside MPI
// calls, so an op advances while somebody waits on it, tests it (is_completed()), or starts
// another op; there is no progress thread, and compute/communication overlap is what the MPI
// library gives.
//
// The frame around every op (argument checks, sequence numbers, traffic, debug checks) is
// Communicator's; this class adds the checks only MPI needs (dtypes, int counts, tags, overlap,
// the poisoned flag) and starts the ops. Traffic is counted with comm/traffic.h's model, not
// whatever algorithm Open MPI picks for a given message size (it may choose recursive doubling
// for small messages). Groups of one and collectives on empty tensors complete at once and
// send nothing, but still take a sequence number; zero-element send/recv do go through MPI,
// so the receiver's element-count check stays honest.
//
// Generation: an MPI job's membership is fixed by its launcher (MPI_COMM_WORLD never changes),
// so there is no rebuild under mpirun; the generation is the one the caller built the group at
// (WorldInfo::generation, 0 for a fresh job), reported by generation(), shared by split()
// groups and named in the build error. It needs no key prefix as Gloo's does: every group is
// its own MPI communicator (MPI_Comm_idup / MPI_Comm_split), so no message of an older group
// can match a newer one's.
//
// Data types. Data movement (allgather, alltoall, broadcast, send/recv) accepts every dtype.
// Reductions accept float32, float64, int8, uint8, int16, int32, int64 (native MPI types), and
// bfloat16 and float16 through krab's own MPI_Ops (each partial result is rounded to the 16-bit
// type, as MPI reduces pairwise); any other dtype -> krab::NotSupported naming it. ReduceOp::kAvg
// sums, then divides by size() when the op completes; it needs a floating dtype. One op moves
// at most 2^31-1 elements (MPI counts are int); larger -> krab::NotSupported.
//
// Failures.
//  * Timeout: wait() throws krab::Timeout "<op> #<seq> on rank <r> timed out after <t> s
//    (backend mpi) ...". Sequence numbers count collectives per communicator; send/recv name
//    the peer, the tag and the next collective's number instead. Unlike Gloo, the message cannot
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
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace krab::comm {

class MpiCommunicator : public Communicator {
 public:
  // State shared by a communicator and the Work handles it returns: the MPI communicator and
  // the poisoned flag. Defined in the .cpp, so that this header does not need mpi.h.
  struct Group;

  // Use make_mpi_communicator(); `group` owns an MPI communicator already set up.
  MpiCommunicator(std::shared_ptr<Group> group, int64_t generation, const Options& options);
  // Frees the MPI communicator (unless MPI is already finalised). Ops still in flight keep
  // their buffers alive and finish, or are abandoned at exit.
  ~MpiCommunicator() override;

  std::string backend() const override { return "mpi"; }

 protected:
  void do_check(const Call& call) const override;
  std::vector<std::string> do_exchange(OpKind op, int64_t seq, const std::string& mine) override;
  WorkPtr do_allreduce(at::Tensor& tensor, ReduceOp op, int64_t seq) override;
  WorkPtr do_allgather(const at::Tensor& input, at::Tensor& output, int64_t seq) override;
  WorkPtr do_reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                            int64_t seq) override;
  WorkPtr do_alltoall(const at::Tensor& input, at::Tensor& output, int64_t seq) override;
  WorkPtr do_broadcast(at::Tensor& tensor, int root, int64_t seq) override;
  WorkPtr do_send(const at::Tensor& tensor, int dst, int tag, int64_t seq) override;
  WorkPtr do_recv(at::Tensor& tensor, int src, int tag, int64_t seq) override;
  WorkPtr do_barrier(int64_t seq) override;
  std::unique_ptr<Communicator> do_split(int color, int key) override;

 private:
  // Throws krab::Error if an earlier op timed out.
  void check_usable() const;

  std::shared_ptr<Group> group_;
};

// Initialises MPI on first use (MPI_Init_thread, MPI_THREAD_SERIALIZED) and returns a group over
// all ranks of the job: MPI_COMM_WORLD duplicated. Each call builds a new, independent group
// (collective over all ranks). Throws krab::Timeout if not every rank arrives within
// options.timeout, krab::NotSupported if MPI was initialised elsewhere with too low a thread
// level, krab::Error if MPI was already finalised. `generation`: see "Generation" above.
std::unique_ptr<Communicator> make_mpi_communicator(const Options& options, int64_t generation = 0);

// True when this process was started by Open MPI's launcher (OMPI_COMM_WORLD_SIZE is set).
bool mpi_launched();

// Ends every rank of the job now (MPI_Abort on MPI_COMM_WORLD) with `exit_code`, after printing
// `why` to stderr. For a rank that cannot continue and must not wait in MPI_Finalize for peers
// stuck in a collective. If MPI is not initialised, it just exits the process.
[[noreturn]] void mpi_abort_job(int exit_code, const std::string& why);

}  // namespace krab::comm
