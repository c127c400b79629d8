#include "comm/backends/mpi/mpi_communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/backends/mpi/mpi_runtime.h"
#include "core/errors.h"

namespace krab::comm {
namespace {

using namespace std::chrono_literals;
using mpi_detail::Backoff;
using mpi_detail::Clock;
using mpi_detail::mpi_error_string;
using mpi_detail::mpi_mutex;
using mpi_detail::Runtime;

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

void check_tensor(const at::Tensor& t, const char* name) {
  KRAB_CHECK_ARG(t.defined(), name, " is undefined");
  KRAB_CHECK_ARG(t.is_contiguous(), name, " must be contiguous");
  KRAB_CHECK_ARG(t.device().is_cpu(), name, " must be a CPU tensor for the mpi backend");
  if (t.numel() > INT_MAX)
    throw NotSupported(str_cat(name, " has ", t.numel(),
                               " elements; the mpi backend moves at "
                               "most 2^31-1 elements per op (MPI counts are int)"));
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

class DoneWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

}  // namespace

// ---- Group: one MPI communicator plus its poisoned flag. ----

struct MpiCommunicator::Group {
  Group(MPI_Comm c, int r, int s) : comm(c), rank(r), size(s) {}
  ~Group() {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    // MPI_Comm_free is legal with ops pending: MPI frees the communicator once they finish.
    Runtime* rt = Runtime::if_started();
    if (comm != MPI_COMM_NULL && rt && !rt->finalized()) MPI_Comm_free(&comm);
  }
  void poison(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.empty()) broken = why;
  }
  std::string poisoned() const {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }

  MPI_Comm comm;
  const int rank;
  const int size;
  mutable std::mutex mu;
  std::string broken;  // why the group is unusable; empty while it is fine
};

namespace {

using GroupPtr = std::shared_ptr<MpiCommunicator::Group>;

// One pending MPI request. The tensors in `keep` stay referenced until MPI is done with them,
// even if this Work is dropped first (the request then moves to the runtime's orphans).
class MpiWork : public Work {
 public:
  MpiWork(GroupPtr group, MPI_Request request, std::vector<at::Tensor> keep, std::string what,
          std::string hint, std::chrono::milliseconds timeout, std::function<void()> finish,
          MPI_Datatype recv_type = MPI_DATATYPE_NULL, int64_t recv_count = -1)
      : group_(std::move(group)),
        request_(request),
        keep_(std::move(keep)),
        what_(std::move(what)),
        hint_(std::move(hint)),
        timeout_(timeout),
        finish_(std::move(finish)),
        recv_type_(recv_type),
        recv_count_(recv_count) {}

  ~MpiWork() override {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    if (Runtime* rt = Runtime::if_started()) rt->adopt(request_, std::move(keep_), false);
  }

  void wait() override {
    Backoff backoff;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!done_) {
          // The deadline counts from the first wait(), shared by every thread that waits.
          if (deadline_ == Clock::time_point{}) deadline_ = Clock::now() + timeout_;
          test_locked();
          if (!done_ && Clock::now() >= deadline_) time_out_locked();
        }
        if (done_) {
          if (error_) std::rethrow_exception(error_);
          return;
        }
      }
      backoff.pause();
    }
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) test_locked();
    return done_;
  }

 private:
  // One MPI_Test; on completion runs the finishing step and records the outcome. Holds mu_.
  void test_locked() {
    int flag = 0, got = -1;
    MPI_Status status;
    int rc;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      rc = MPI_Test(&request_, &flag, &status);
      if (rc == MPI_SUCCESS && flag && recv_count_ >= 0) MPI_Get_count(&status, recv_type_, &got);
      if (rc != MPI_SUCCESS) {
        // A failed request may never complete: treat it like a timed-out one at exit.
        Runtime::if_started()->adopt(request_, std::move(keep_), true);
        request_ = MPI_REQUEST_NULL;
      }
    }
    if (rc != MPI_SUCCESS) {
      finish(std::make_exception_ptr(
          Error(str_cat(what_, " failed (backend mpi): ", mpi_error_string(rc)))));
      return;
    }
    if (!flag) return;
    std::exception_ptr error;
    if (recv_count_ >= 0 && got != recv_count_) {
      error = std::make_exception_ptr(
          Error(str_cat(what_, " expected ", recv_count_, " elements but the sender sent ", got,
                        " (backend mpi)")));
    } else if (finish_) {
      try {
        finish_();
      } catch (...) {
        error = std::current_exception();
      }
    }
    finish(error);
  }

  // MPI cannot cancel a collective, so the request (and its buffers) is handed to the runtime
  // for good and the group refuses further ops: they would match the wrong peers' calls.
  void time_out_locked() {
    const std::string msg = str_cat(what_, " timed out after ", timeout_.count() / 1000.0,
                                    " s (backend mpi): ", hint_, "; MPI cannot tell which rank");
    group_->poison(msg);
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      Runtime::if_started()->adopt(request_, std::move(keep_), true);
      request_ = MPI_REQUEST_NULL;
    }
    finish(std::make_exception_ptr(
        Timeout(str_cat(msg,
                        ". The communicator is unusable now (MPI cannot cancel the op); "
                        "end the job"))));
  }

  void finish(std::exception_ptr error) {
    error_ = std::move(error);
    done_ = true;
    keep_.clear();
    finish_ = nullptr;
  }

  GroupPtr group_;
  std::mutex mu_;  // guards everything below
  MPI_Request request_;
  std::vector<at::Tensor> keep_;
  std::string what_;
  std::string hint_;
  std::chrono::milliseconds timeout_;
  std::function<void()> finish_;
  MPI_Datatype recv_type_;
  int64_t recv_count_;
  Clock::time_point deadline_{};
  bool done_ = false;
  std::exception_ptr error_;
};

constexpr const char* kCollectiveHint = "a rank has not joined it, or is stuck before it";

// Starts `call` under the MPI lock (reaping finished orphans first) and wraps its request.
WorkPtr start(const GroupPtr& group, const std::string& what, const char* hint,
              std::chrono::milliseconds timeout, std::vector<at::Tensor> keep,
              const std::function<int(MPI_Request*)>& call, std::function<void()> finish = nullptr,
              MPI_Datatype recv_type = MPI_DATATYPE_NULL, int64_t recv_count = -1) {
  MPI_Request request = MPI_REQUEST_NULL;
  int rc;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    Runtime::if_started()->reap();  // set: a group exists, so MPI is up
    rc = call(&request);
  }
  if (rc != MPI_SUCCESS)
    throw Error(str_cat(what, " could not start (backend mpi): ", mpi_error_string(rc)));
  return std::make_shared<MpiWork>(group, request, std::move(keep), what, hint, timeout,
                                   std::move(finish), recv_type, recv_count);
}

MPI_Datatype element_type(const at::Tensor& t, const char* what) {
  const MPI_Datatype type = Runtime::get().element_type(t.element_size());
  if (type == MPI_DATATYPE_NULL)
    throw NotSupported(str_cat(what, ": dtype ", t.scalar_type(), " has an item size of ",
                               t.element_size(), " bytes, which the mpi backend cannot move"));
  return type;
}

}  // namespace

// ---- MpiCommunicator ----

MpiCommunicator::MpiCommunicator(std::shared_ptr<Group> group, const Options& options)
    : group_(std::move(group)), options_(options), rank_(group_->rank), size_(group_->size) {}

MpiCommunicator::~MpiCommunicator() = default;

void MpiCommunicator::check_usable() const {
  const std::string why = group_->poisoned();
  if (!why.empty())
    throw Error(str_cat("the mpi communicator on rank ", rank_, " is unusable since ", why,
                        " (MPI cannot cancel an op in flight; end the job)"));
}

int64_t MpiCommunicator::begin(OpKind op, const at::Tensor* tensor) {
  check_usable();
  const int64_t seq = seq_++;
  if (!options_.debug_checks || size_ == 1) return seq;
  // Everyone all-gathers a fixed-size description of the op it is about to start; all ranks
  // see the same table, so either all of them throw or none does, and the group stays in step.
  constexpr int kLen = 96;
  std::string mine = str_cat(op_name(op), " ", tensor ? describe(*tensor) : "-");
  mine.resize(std::min<size_t>(mine.size(), kLen - 1));
  at::Tensor table = at::zeros({size_ * kLen}, at::kByte);
  char* all = static_cast<char*>(table.data_ptr());
  std::memcpy(all + rank_ * kLen, mine.data(), mine.size());
  const MPI_Comm comm = group_->comm;
  start(group_, str_cat("debug check of ", op_name(op), " #", seq, " on rank ", rank_),
        kCollectiveHint, options_.timeout, {table},
        [&](MPI_Request* r) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, all, kLen, MPI_BYTE, comm, r);
        })
      ->wait();
  for (int r = 0; r < size_; ++r) {
    const std::string theirs(all + r * kLen);
    if (theirs != mine)
      throw Error(str_cat("collective mismatch at #", seq, ": rank ", rank_, " called ", mine,
                          " but rank ", r, " called ", theirs, " (backend mpi)"));
  }
  return seq;
}

void MpiCommunicator::count(OpKind op, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  traffic_.add(op, bytes);
}

TrafficStats MpiCommunicator::traffic() const {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  return traffic_;
}

WorkPtr MpiCommunicator::allreduce(at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce tensor");
  KRAB_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                 "allreduce average needs a floating-point tensor, got ", tensor.scalar_type());
  const MPI_Datatype type = Runtime::get().reduce_type(tensor.scalar_type(), "allreduce tensor");
  const int64_t seq = begin(OpKind::kAllreduce, &tensor);
  const uint64_t n = tensor.nbytes();
  count(OpKind::kAllreduce, size_ > 1 ? 2 * (size_ - 1) * n / size_ : 0);
  if (tensor.numel() == 0 || size_ == 1) return std::make_shared<DoneWork>();
  const MPI_Op mpi_op = Runtime::get().reduce_op(op, tensor.scalar_type());
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) {
    at::Tensor t = tensor;
    const int w = size_;
    finish = [t, w]() mutable { t.div_(w); };
  }
  void* data = tensor.data_ptr();
  const int count = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  return start(
      group_, str_cat("allreduce #", seq, " on rank ", rank_), kCollectiveHint, options_.timeout,
      {tensor},
      [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op, comm, r);
      },
      std::move(finish));
}

WorkPtr MpiCommunicator::allgather(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "allgather input");
  check_tensor(output, "allgather output");
  KRAB_CHECK_ARG(output.numel() == input.numel() * size_, "allgather output must have ",
                 input.numel() * size_, " elements (size x input), got ", output.numel());
  KRAB_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "allgather output dtype must match the input's");
  KRAB_CHECK_ARG(!overlaps(input, output), "allgather input and output must not overlap");
  const MPI_Datatype type = element_type(input, "allgather input");
  const int64_t seq = begin(OpKind::kAllgather, &input);
  count(OpKind::kAllgather, static_cast<uint64_t>(size_ - 1) * input.nbytes());
  if (input.numel() == 0) return std::make_shared<DoneWork>();
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return std::make_shared<DoneWork>();
  }
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const int n = static_cast<int>(input.numel());
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("allgather #", seq, " on rank ", rank_), kCollectiveHint,
               options_.timeout, {input, output},
               [&](MPI_Request* r) { return MPI_Iallgather(in, n, type, out, n, type, comm, r); });
}

WorkPtr MpiCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter input");
  check_tensor(output, "reduce_scatter output");
  KRAB_CHECK_ARG(input.numel() == output.numel() * size_, "reduce_scatter input must have ",
                 output.numel() * size_, " elements (size x output), got ", input.numel());
  KRAB_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "reduce_scatter output dtype must match the input's");
  KRAB_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(input.scalar_type()),
                 "reduce_scatter average needs a floating-point tensor, got ", input.scalar_type());
  KRAB_CHECK_ARG(!overlaps(input, output), "reduce_scatter input and output must not overlap");
  const MPI_Datatype type = Runtime::get().reduce_type(input.scalar_type(), "reduce_scatter input");
  const int64_t seq = begin(OpKind::kReduceScatter, &input);
  count(OpKind::kReduceScatter, static_cast<uint64_t>(size_ - 1) * output.nbytes());
  if (output.numel() == 0) return std::make_shared<DoneWork>();
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return std::make_shared<DoneWork>();
  }
  const MPI_Op mpi_op = Runtime::get().reduce_op(op, input.scalar_type());
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) {
    at::Tensor t = output;
    const int w = size_;
    finish = [t, w]() mutable { t.div_(w); };
  }
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const int n = static_cast<int>(output.numel());
  const MPI_Comm comm = group_->comm;
  return start(
      group_, str_cat("reduce_scatter #", seq, " on rank ", rank_), kCollectiveHint,
      options_.timeout, {input, output},
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(in, out, n, type, mpi_op, comm, r); },
      std::move(finish));
}

WorkPtr MpiCommunicator::alltoall(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "alltoall input");
  check_tensor(output, "alltoall output");
  check_alltoall_sizes(input, output, size_);
  KRAB_CHECK_ARG(!overlaps(input, output), "alltoall input and output must not overlap");
  const MPI_Datatype type = element_type(input, "alltoall input");
  const int64_t seq = begin(OpKind::kAlltoall, &input);
  count(OpKind::kAlltoall, static_cast<uint64_t>(size_ - 1) * input.nbytes() / size_);
  if (input.numel() == 0) return std::make_shared<DoneWork>();
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return std::make_shared<DoneWork>();
  }
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const int n = static_cast<int>(input.numel() / size_);
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("alltoall #", seq, " on rank ", rank_), kCollectiveHint,
               options_.timeout, {input, output},
               [&](MPI_Request* r) { return MPI_Ialltoall(in, n, type, out, n, type, comm, r); });
}

WorkPtr MpiCommunicator::broadcast(at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast tensor");
  KRAB_CHECK_ARG(root >= 0 && root < size_, "broadcast root ", root, " is outside 0..", size_ - 1);
  const MPI_Datatype type = element_type(tensor, "broadcast tensor");
  const int64_t seq = begin(OpKind::kBroadcast, &tensor);
  count(OpKind::kBroadcast, rank_ == root ? static_cast<uint64_t>(size_ - 1) * tensor.nbytes() : 0);
  if (tensor.numel() == 0 || size_ == 1) return std::make_shared<DoneWork>();
  void* data = tensor.data_ptr();
  const int n = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("broadcast #", seq, " from root ", root, " on rank ", rank_),
               kCollectiveHint, options_.timeout, {tensor},
               [&](MPI_Request* r) { return MPI_Ibcast(data, n, type, root, comm, r); });
}

namespace {
void check_tag(int tag, const char* what) {
  int* ub = nullptr;
  int found = 0;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  }
  const int max_tag = found && ub ? *ub : 32767;  // the standard guarantees at least 32767
  KRAB_CHECK_ARG(tag >= 0 && tag <= max_tag, what, " tag ", tag, " is outside 0..", max_tag);
}
}  // namespace

WorkPtr MpiCommunicator::send(const at::Tensor& tensor, int dst, int tag) {
  check_tensor(tensor, "send tensor");
  KRAB_CHECK_ARG(dst >= 0 && dst < size_ && dst != rank_, "send destination ", dst,
                 " must be another rank in 0..", size_ - 1);
  check_tag(tag, "send");
  check_usable();
  const MPI_Datatype type = element_type(tensor, "send tensor");
  count(OpKind::kSend, tensor.nbytes());
  const void* data = tensor.data_ptr();
  const int n = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  // Zero-element messages are still sent: they cost nothing and keep the receiver's matching
  // (and its element-count check) honest.
  return start(group_,
               str_cat("send to rank ", dst, " (tag ", tag, ") on rank ", rank_,
                       ", next collective #", seq_),
               "the receiver has not posted the matching recv", options_.timeout, {tensor},
               [&](MPI_Request* r) { return MPI_Isend(data, n, type, dst, tag, comm, r); });
}

WorkPtr MpiCommunicator::recv(at::Tensor& tensor, int src, int tag) {
  check_tensor(tensor, "recv tensor");
  KRAB_CHECK_ARG(src >= 0 && src < size_ && src != rank_, "recv source ", src,
                 " must be another rank in 0..", size_ - 1);
  check_tag(tag, "recv");
  check_usable();
  const MPI_Datatype type = element_type(tensor, "recv tensor");
  count(OpKind::kRecv, 0);
  void* data = tensor.data_ptr();
  const int n = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  return start(
      group_,
      str_cat("recv from rank ", src, " (tag ", tag, ") on rank ", rank_, ", next collective #",
              seq_),
      "the sender has not sent it", options_.timeout, {tensor},
      [&](MPI_Request* r) { return MPI_Irecv(data, n, type, src, tag, comm, r); }, nullptr, type,
      n);
}

WorkPtr MpiCommunicator::barrier() {
  const int64_t seq = begin(OpKind::kBarrier, nullptr);
  count(OpKind::kBarrier, 0);
  if (size_ == 1) return std::make_shared<DoneWork>();
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("barrier #", seq, " on rank ", rank_), kCollectiveHint,
               options_.timeout, {}, [&](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  check_usable();
  // MPI_Comm_split blocks without a timeout, so first make sure every rank has arrived: an
  // all-gather of (color, key) that is polled under the timeout like any other op.
  at::Tensor table = at::zeros({size_ * 2}, at::kInt);
  int32_t* all = table.data_ptr<int32_t>();
  all[2 * rank_] = color;
  all[2 * rank_ + 1] = key;
  const MPI_Comm comm = group_->comm;
  start(group_, str_cat("split (color ", color, ", key ", key, ") on rank ", rank_),
        kCollectiveHint, options_.timeout, {table},
        [&](MPI_Request* r) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_INT32_T, all, 2, MPI_INT32_T, comm, r);
        })
      ->wait();
  int members = 0, new_rank = 0;
  for (int r = 0; r < size_; ++r) {
    if (color < 0 || all[2 * r] != color) continue;
    // MPI orders by (key, old rank): count who sorts before me.
    if (all[2 * r + 1] < key || (all[2 * r + 1] == key && r < rank_)) ++new_rank;
    ++members;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  int rc;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    rc = MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (rc == MPI_SUCCESS && sub != MPI_COMM_NULL) MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  }
  if (rc != MPI_SUCCESS)
    throw Error(str_cat("split on rank ", rank_, " failed (backend mpi): ", mpi_error_string(rc)));
  if (sub == MPI_COMM_NULL) return nullptr;
  int r = 0, s = 0;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_rank(sub, &r);
    MPI_Comm_size(sub, &s);
  }
  KRAB_CHECK(r == new_rank && s == members, "MPI_Comm_split gave rank ", r, " of ", s,
             ", expected ", new_rank, " of ", members);
  return std::make_unique<MpiCommunicator>(std::make_shared<Group>(sub, r, s), options_);
}

// ---- Factory and process-level helpers ----

std::unique_ptr<Communicator> make_mpi_communicator(const Options& options) {
  Runtime::get();
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  int rank = 0, size = 1, rc;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request);
  }
  if (rc != MPI_SUCCESS)
    throw Error(str_cat("building the mpi group on rank ", rank,
                        ": MPI_Comm_idup failed: ", mpi_error_string(rc)));
  // The duplicate is only usable once the request completes, on every rank.
  const auto deadline = Clock::now() + options.timeout;
  Backoff backoff;
  for (;;) {
    int done = 0;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done && Clock::now() >= deadline) {
        Runtime::if_started()->adopt(request, {}, true);
        throw Timeout(str_cat("building the mpi group (", size, " ranks) on rank ", rank,
                              " timed out after ", options.timeout.count() / 1000.0,
                              " s: not every rank called make_mpi_communicator"));
      }
      if (done) {
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        break;
      }
    }
    backoff.pause();
  }
  return std::make_unique<MpiCommunicator>(
      std::make_shared<MpiCommunicator::Group>(comm, rank, size), options);
}

bool mpi_launched() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

void mpi_abort_job(int exit_code, const std::string& why) {
  std::fprintf(stderr, "krab: %s\n", why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    // Not waiting for mpi_mutex(): the thread holding it may be the one that is stuck.
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace krab::comm
