// The backend-independent collective test suite.
//
// Every Communicator backend must pass it: the Gloo test runs it on ranks that are threads of
// one process, the MPI test on ranks that are processes under mpirun. Every rank of the group
// calls run_collective_suite() on its own communicator at the same time; the suite issues the
// same ops in the same order on every rank, whatever the outcome of its checks, so a failed
// expectation on one rank never leaves the others waiting in a collective.
//
// Values are derived from the rank so each expectation has a closed form (no reference run):
//   allreduce       sum / avg / max / min, element counts {0, 1, 7, 1000, 65537}, dtypes
//                   float32, float64, int64 (avg only for the floats), plus a 2-D tensor;
//                   signs alternate by element, so max and min are won by different ranks
//   allgather       counts {0, 1, 7, 1000}, float32 and int64, plus 2-D
//   reduce_scatter  sum (float32, int64), max (float32), avg (float64), counts {0, 1, 7, 1000}
//   alltoall        float32, int64, uint8, chunk sizes {0, 1, 7, 100}
//   broadcast       from every root, float32 and int64
//   send / recv     a ring rank -> rank+1 with two tags, received in the opposite order
//   barrier         a few, with is_completed() after wait()
//   split           even/odd ranks, then an allreduce inside each half; descending keys;
//                   a negative color (that rank gets nullptr)
//   traffic         bytes and op counts grow as the model both backends document:
//                   allreduce 2(W-1)/W·N (rounded down), allgather (W-1)·n, reduce_scatter
//                   (W-1)·output bytes, alltoall (W-1)/W·N, broadcast (W-1)·N at the root and 0
//                   elsewhere, send N, recv 0
//   wire_bytes      for every op, odd and empty sizes and every broadcast root, the bytes
//                   counted equal comm::wire_bytes() (the formula a planner calls)
//   arguments       non-contiguous tensors, wrong output sizes, mismatched dtypes, ranks out of
//                   range and kAvg on integers throw krab::InvalidArgument before any traffic,
//                   and the group is still in step afterwards
// Failures are reported with gtest's EXPECT_ macros (thread-safe), tagged with the rank. The
// suite takes well under a second for 3 ranks on loopback.
#pragma once

#include "comm/communicator.h"

namespace krab::testing {

// Runs the whole suite on `comm`; call it from every rank of the group concurrently. Leaves the
// group usable (and in step) if every op succeeded.
void run_collective_suite(krab::comm::Communicator& comm);

}  // namespace krab::testing
