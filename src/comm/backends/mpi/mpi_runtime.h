// The process-wide half of the MPI backend (internal to comm/backends/mpi/).
//
// MPI is one library state per process, shared by every MpiCommunicator: its initialisation
// and finalisation, the lock around every MPI call, the datatypes and reduction ops krab adds
// (MPI has no bfloat16 or float16), and the requests nobody waits on any more. That state lives
// here; mpi_communicator.cpp holds the per-group part.
//
// Lifetime. Runtime::get() initialises MPI on first use (MPI_Init_thread requesting
// MPI_THREAD_SERIALIZED; mpi_communicator.h says why) and registers a static guard whose
// destructor finalises MPI at process exit. The Runtime object itself is never deleted, so code
// that runs during static destruction (a Work or group destroyed late) can still reach it and
// finds finalized() true.
//
// Orphans. MPI may keep writing into a buffer until its request completes, and a collective
// cannot be cancelled. When a Work is dropped before its op completed, or gives up on a timeout,
// its request and tensors are handed to adopt(); reap() releases the ones that have completed.
// At exit, finalize() drains them for up to 5 s (none at all if one came from a timeout: it will
// never complete) and, if any is left, ends the job with MPI_Abort(1) instead of letting
// MPI_Finalize wait for a peer that is not coming.
//
// Threading: every MPI call anywhere in the backend is made holding mpi_mutex(), and only
// nonblocking calls are made while holding it (the one exception, MPI_Comm_split, runs only once
// every rank is known to have arrived). Runtime's mutable members are guarded by it too.
#pragma once

// Open MPI's and MPICH's mpi.h pull in deprecated C++ bindings unless told not to.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace krab::comm::mpi_detail {

using Clock = std::chrono::steady_clock;

// The lock every MPI call in the process takes.
std::mutex& mpi_mutex();

// MPI's text for an error code.
std::string mpi_error_string(int code);

// Polling schedule for a pending request: yield for the first millisecond (small collectives
// finish there, and MPI progresses only when called), then sleep with doubling pauses up to
// 1 ms so that oversubscribed ranks leave the CPU to the peers they are waiting for.
class Backoff {
 public:
  void pause() {
    using namespace std::chrono_literals;
    if (Clock::now() < spin_until_) {
      std::this_thread::yield();
      return;
    }
    sleep_ = std::min<std::chrono::microseconds>(std::max(sleep_ * 2, 20us), 1000us);
    std::this_thread::sleep_for(sleep_);
  }

 private:
  Clock::time_point spin_until_ = Clock::now() + std::chrono::milliseconds(1);
  std::chrono::microseconds sleep_{0};
};

class Runtime {
 public:
  // Initialises MPI on the first call (thread-safe) and returns the runtime. Throws krab::Error
  // if MPI was already finalised or MPI_Init_thread failed, krab::NotSupported if the
  // application initialised MPI itself below MPI_THREAD_SERIALIZED. Do not call it holding
  // mpi_mutex() before MPI is up.
  static Runtime& get();
  // The runtime if MPI was initialised through get(), else nullptr. Never blocks.
  static Runtime* if_started();

  // The datatype that moves one element of `item_size` bytes opaquely (allgather, broadcast,
  // send/recv: the dtype does not matter), or MPI_DATATYPE_NULL for an unknown size.
  MPI_Datatype element_type(size_t item_size) const;
  // The datatype a reduction of dtype `t` uses; krab::NotSupported naming `what` and the dtype
  // if MPI cannot reduce it.
  MPI_Datatype reduce_type(at::ScalarType t, const char* what) const;
  // The MPI_Op for `op` on dtype `t` (kAvg is a sum; the caller divides afterwards).
  MPI_Op reduce_op(ReduceOp op, at::ScalarType t) const;

  // The members below must be called holding mpi_mutex().
  // Takes over a still-pending request and the tensors it uses. `timed_out`: it was given up
  // on, and will likely never complete. A no-op once MPI is finalised.
  void adopt(MPI_Request request, std::vector<at::Tensor> keep, bool timed_out);
  // Releases the adopted requests that have completed meanwhile.
  void reap();
  bool finalized() const { return finalized_; }

  // Called once at exit by the static guard (takes mpi_mutex() itself).
  void finalize();

 private:
  Runtime();

  struct Orphan {
    MPI_Request request;
    std::vector<at::Tensor> keep;
  };
  bool owns_init_ = false;  // false if the application initialised MPI (it finalises it too)
  bool finalized_ = false;
  bool stuck_ = false;  // an adopted request came from a timeout
  MPI_Op sum16_ = MPI_OP_NULL, max16_ = MPI_OP_NULL, min16_ = MPI_OP_NULL;
  std::array<MPI_Datatype, 17> element_{};  // by item size
  std::vector<Orphan> orphans_;
};

}  // namespace krab::comm::mpi_detail
