// Gloo backend: collectives through c10d's ProcessGroupGloo over TCP.
//
// What goes on the wire (payload per rank, counted by the traffic meter; N = tensor bytes,
// W = group size). Gloo runs these algorithms for CPU tensors:
//   allreduce       ring (reduce-scatter then all-gather of W segments): 2 (W-1)/W · N
//   allgather       ring: (W-1) · n, n = one rank's input bytes
//   reduce_scatter  Gloo has no reduce-scatter; krab runs an all-to-all of the W chunks and
//                   sums locally, which is the optimal (W-1)/W · N
//   alltoall        (W-1)/W · N: every chunk but one's own
//   broadcast       counted at the root as (W-1) · N: what any spanning tree moves in total,
//                   so the sum over ranks is exact whatever tree Gloo picks
//   send            N; recv 0 (counted at the sender); barrier 0
// Empty tensors complete at once and send nothing, but still take a sequence number.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "comm/communicator.h"
#include "comm/store.h"

namespace c10d {
class ProcessGroupGloo;
}

namespace krab::comm {

class PeerMonitor;

class GlooCommunicator : public Communicator {
 public:
  // `connect` opens a client to the rendezvous store (called once for the group's own use and
  // once by the peer monitor). `prefix` must be unique to this group ("g0/", "g0/split1/c0/").
  // `address` is the local IPv4 address or interface name Gloo binds to.
  GlooCommunicator(std::function<StorePtr()> connect, const std::string& prefix, int rank,
                   int size, int64_t generation, const std::string& address,
                   const Options& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t generation() const override { return generation_; }
  std::string backend() const override { return "gloo"; }

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
  // Starts collective number seq_: heartbeat record, debug shape check.
  int64_t begin(OpKind op, const at::Tensor* tensor);
  void count(OpKind op, uint64_t bytes);

  std::function<StorePtr()> connect_;
  std::string prefix_;
  int rank_;
  int size_;
  int64_t generation_;
  std::string address_;
  Options options_;
  StorePtr store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::shared_ptr<PeerMonitor> monitor_;
  int64_t seq_ = 0;
  int64_t splits_ = 0;
  mutable std::mutex traffic_mu_;
  TrafficStats traffic_;
};

}  // namespace krab::comm
