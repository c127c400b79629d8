#include "comm/communicator.h"

#include <sstream>

#include "core/errors.h"

namespace krab::comm {
namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// What an aborted group hands out instead of starting an op: complete at once (nothing will
// ever run), failing where the caller waits rather than where it launches.
class RefusedWork : public Work {
 public:
  explicit RefusedWork(std::exception_ptr error) : error_(std::move(error)) {}
  void wait() override { std::rethrow_exception(error_); }
  bool is_completed() override { return true; }

 private:
  std::exception_ptr error_;
};

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

void check_same_dtype(const at::Tensor& input, const at::Tensor& output, const char* op) {
  KRAB_CHECK_ARG(output.scalar_type() == input.scalar_type(), op,
                 " output dtype must match the input's");
}

void check_average(ReduceOp op, const at::Tensor& t, const char* what) {
  KRAB_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()), what,
                 " average needs a floating-point tensor, got ", t.scalar_type());
}

}  // namespace

Communicator::Communicator(int rank, int size, int64_t generation, const Options& options)
    : rank_(rank), size_(size), generation_(generation), options_(options) {
  KRAB_CHECK_ARG(size >= 1, "group size must be >= 1, got ", size);
  KRAB_CHECK_ARG(rank >= 0 && rank < size, "rank ", rank, " is outside 0..", size - 1);
  KRAB_CHECK_ARG(generation >= 0, "generation must be >= 0, got ", generation);
}

WorkPtr Communicator::completed() { return std::make_shared<DoneWork>(); }

std::string AbortSignal::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

bool AbortSignal::raise(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (raised_.load(std::memory_order_relaxed)) return false;
  reason_ = reason;
  // Release after the reason is written: a reader that sees raised() also sees the reason
  // (it takes the mutex anyway; the ordering keeps raised() itself lock-free).
  raised_.store(true, std::memory_order_release);
  return true;
}

std::exception_ptr AbortSignal::error() const {
  return std::make_exception_ptr(MembershipChanged(reason()));
}

void Communicator::abort(const std::string& reason) { abort_->raise(reason); }

WorkPtr Communicator::refused() const {
  if (!abort_->raised()) return nullptr;
  return std::make_shared<RefusedWork>(abort_->error());
}

TrafficStats Communicator::traffic() const {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  return traffic_;
}

void Communicator::count(OpKind op, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  traffic_.add(op, bytes);
}

void Communicator::check_tensor(const at::Tensor& t, const char* name) const {
  KRAB_CHECK_ARG(t.defined(), name, " is undefined");
  KRAB_CHECK_ARG(t.is_contiguous(), name, " must be contiguous");
  KRAB_CHECK_ARG(t.device().is_cpu(), name, " must be a CPU tensor for the ", backend(),
                 " backend");
}

int64_t Communicator::begin(const Call& call, uint64_t bytes) {
  do_check(call);
  const int64_t seq = seq_++;
  do_enter(call.op, seq);
  if (options_.debug_checks && size_ > 1) check_same_op(call, seq);
  count(call.op, bytes);
  return seq;
}

void Communicator::check_same_op(const Call& call, int64_t seq) {
  // Every rank publishes what it is about to run and compares with everybody else's; all ranks
  // see the same descriptions, so either all of them throw or none does, before the op starts.
  const std::string mine = str_cat(op_name(call.op), " ", call.input ? describe(*call.input) : "-");
  const std::vector<std::string> all = do_exchange(call.op, seq, mine);
  KRAB_CHECK(static_cast<int>(all.size()) == size_, "debug check got ", all.size(),
             " descriptions for ", size_, " ranks");
  for (int r = 0; r < size_; ++r)
    if (all[r] != all[rank_])
      throw Error(str_cat("collective mismatch at #", seq, ": rank ", rank_, " called ", all[rank_],
                          " but rank ", r, " called ", all[r], " (backend ", backend(), ")"));
}

WorkPtr Communicator::allreduce(at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce tensor");
  check_average(op, tensor, "allreduce");
  Call call{OpKind::kAllreduce, &tensor};
  call.reduce = op;
  if (auto no = refused()) return no;
  const int64_t seq = begin(call, wire_bytes(call.op, tensor.nbytes(), size_));
  if (tensor.numel() == 0 || size_ == 1) return completed();
  return do_allreduce(tensor, op, seq);
}

WorkPtr Communicator::allgather(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "allgather input");
  check_tensor(output, "allgather output");
  KRAB_CHECK_ARG(output.numel() == input.numel() * size_, "allgather output must have ",
                 input.numel() * size_, " elements (size x input), got ", output.numel());
  check_same_dtype(input, output, "allgather");
  const Call call{OpKind::kAllgather, &input, &output};
  if (auto no = refused()) return no;
  const int64_t seq = begin(call, wire_bytes(call.op, input.nbytes(), size_));
  if (input.numel() == 0) return completed();
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return completed();
  }
  return do_allgather(input, output, seq);
}

WorkPtr Communicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter input");
  check_tensor(output, "reduce_scatter output");
  KRAB_CHECK_ARG(input.numel() == output.numel() * size_, "reduce_scatter input must have ",
                 output.numel() * size_, " elements (size x output), got ", input.numel());
  check_same_dtype(input, output, "reduce_scatter");
  check_average(op, input, "reduce_scatter");
  Call call{OpKind::kReduceScatter, &input, &output};
  call.reduce = op;
  if (auto no = refused()) return no;
  const int64_t seq = begin(call, wire_bytes(call.op, input.nbytes(), size_));
  if (output.numel() == 0) return completed();
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return completed();
  }
  return do_reduce_scatter(input, output, op, seq);
}

WorkPtr Communicator::alltoall(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "alltoall input");
  check_tensor(output, "alltoall output");
  KRAB_CHECK_ARG(output.numel() == input.numel(), "alltoall output must have ", input.numel(),
                 " elements like the input, got ", output.numel());
  check_same_dtype(input, output, "alltoall");
  KRAB_CHECK_ARG(input.numel() % size_ == 0, "alltoall input has ", input.numel(),
                 " elements, not a multiple of the group size ", size_);
  const Call call{OpKind::kAlltoall, &input, &output};
  if (auto no = refused()) return no;
  const int64_t seq = begin(call, wire_bytes(call.op, input.nbytes(), size_));
  if (input.numel() == 0) return completed();
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return completed();
  }
  return do_alltoall(input, output, seq);
}

WorkPtr Communicator::broadcast(at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast tensor");
  KRAB_CHECK_ARG(root >= 0 && root < size_, "broadcast root ", root, " is outside 0..", size_ - 1);
  Call call{OpKind::kBroadcast, &tensor};
  call.peer = root;
  if (auto no = refused()) return no;
  // Counted at the root only: see wire_bytes().
  const uint64_t bytes = rank_ == root ? wire_bytes(call.op, tensor.nbytes(), size_) : 0;
  const int64_t seq = begin(call, bytes);
  if (tensor.numel() == 0 || size_ == 1) return completed();
  return do_broadcast(tensor, root, seq);
}

// The argument checks send and recv share.
void Communicator::check_point_to_point(OpKind op, const at::Tensor& tensor, int peer) const {
  const bool sending = op == OpKind::kSend;
  check_tensor(tensor, sending ? "send tensor" : "recv tensor");
  KRAB_CHECK_ARG(peer >= 0 && peer < size_ && peer != rank_,
                 sending ? "send destination " : "recv source ", peer,
                 " must be another rank in 0..", size_ - 1);
}

// What send and recv share before the backend, once the arguments passed: its checks and the
// traffic count.
void Communicator::enter_point_to_point(OpKind op, const at::Tensor& tensor, int peer, int tag) {
  Call call{op, &tensor};
  call.peer = peer;
  call.tag = tag;
  do_check(call);
  count(op, wire_bytes(op, tensor.nbytes(), size_));
}

WorkPtr Communicator::send(const at::Tensor& tensor, int dst, int tag) {
  check_point_to_point(OpKind::kSend, tensor, dst);
  if (auto no = refused()) return no;
  enter_point_to_point(OpKind::kSend, tensor, dst, tag);
  return do_send(tensor, dst, tag, seq_);
}

WorkPtr Communicator::recv(at::Tensor& tensor, int src, int tag) {
  check_point_to_point(OpKind::kRecv, tensor, src);
  if (auto no = refused()) return no;
  enter_point_to_point(OpKind::kRecv, tensor, src, tag);
  return do_recv(tensor, src, tag, seq_);
}

WorkPtr Communicator::barrier() {
  const Call call{OpKind::kBarrier};
  if (auto no = refused()) return no;
  const int64_t seq = begin(call, wire_bytes(call.op, 0, size_));
  if (size_ == 1) return completed();
  return do_barrier(seq);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  // Not a Work: split blocks, and is never called from a hook, so it fails where it is called.
  if (abort_->raised()) std::rethrow_exception(abort_->error());
  auto group = do_split(color, key);
  KRAB_CHECK(color >= 0 || group == nullptr, "a negative color joined a group");
  return group;
}

}  // namespace krab::comm
