// Gloo backend: collectives through c10d's ProcessGroupGloo over TCP.
//
// The frame around every op (checks, sequence numbers, traffic, debug checks) is
// Communicator's; this class only starts the ops on c10d and turns Gloo's errors into ones that
// name ranks (PeerMonitor). Gloo runs a ring allreduce and allgather for CPU tensors, and has no
// reduce-scatter: krab runs an all-to-all of the W chunks and reduces locally, which moves the
// optimal (W-1)/W of the input. Traffic is counted with comm/traffic.h's model.
//
// With Options::abortable (elastic membership) a wait polls its c10d op every 50 ms, so abort()
// ends it within a slice, and a failed op is reported through Options::on_peer_error instead
// of diagnosed (no PeerMonitor::diagnose, which blocks 0.6-3 s). Destroying the group blocks
// until c10d's worker thread has finished the op it is in (at Gloo's timeout when a peer
// froze): hand an aborted group to comm::Reaper rather than destroying it on the training
// thread.
//
// Debug checks go through the rendezvous store: each rank writes its description of op #seq
// under "dbg/<seq>/<rank>" and reads everybody else's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"

namespace c10d {
class ProcessGroupGloo;
class Work;
}  // namespace c10d

namespace krab::comm {

class PeerMonitor;
struct WorkContext;

class GlooCommunicator : public Communicator {
 public:
  // `connect` opens a client to the rendezvous store (called once for the group's own use and
  // once by the peer monitor). `prefix` must be unique to this group ("g0/", "g0/split1/c0/").
  // `address` is the local IPv4 address or interface name Gloo binds to.
  GlooCommunicator(std::function<StorePtr()> connect, const std::string& prefix, int rank, int size,
                   int64_t generation, const std::string& address, const Options& options);
  ~GlooCommunicator() override;

  std::string backend() const override { return "gloo"; }

 protected:
  std::vector<std::string> do_exchange(OpKind op, int64_t seq, const std::string& mine) override;
  void do_enter(OpKind op, int64_t seq) override;
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
  // Wraps a c10d work with the group's timeout and diagnosis; `finish` runs once it completed.
  WorkPtr wrap(c10::intrusive_ptr<c10d::Work> work, OpKind op, int64_t seq,
               std::function<void()> finish = nullptr);
  // Builds the c10d group, or throws Timeout naming the ranks that did not arrive.
  void connect_group();

  std::function<StorePtr()> connect_;
  std::string prefix_;
  std::string address_;
  StorePtr store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::shared_ptr<PeerMonitor> monitor_;
  std::shared_ptr<const WorkContext> work_context_;  // shared by every Work; made at first op
  int64_t splits_ = 0;
};

}  // namespace krab::comm
