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

// The name the frame's messages give an op's tensor ("allreduce tensor", "alltoall input").
std::string arg_name(OpKind op, bool output) {
  if (output) return str_cat(op_name(op), " output");
  const bool in_place = op == OpKind::kAllreduce || op == OpKind::kBroadcast ||
                        op == OpKind::kSend || op == OpKind::kRecv;
  return str_cat(op_name(op), in_place ? " tensor" : " input");
}

void check_count(const at::Tensor& t, const std::string& name) {
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

MPI_Datatype element_type(const at::Tensor& t, const std::string& what) {
  const MPI_Datatype type = Runtime::get().element_type(t.element_size());
  if (type == MPI_DATATYPE_NULL)
    throw NotSupported(str_cat(what, ": dtype ", t.scalar_type(), " has an item size of ",
                               t.element_size(), " bytes, which the mpi backend cannot move"));
  return type;
}

}  // namespace

// ---- MpiCommunicator ----

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

// kAvg sums; the op's finishing step divides once MPI is done.
std::function<void()> average_step(ReduceOp op, const at::Tensor& result, int size) {
  if (op != ReduceOp::kAvg) return nullptr;
  at::Tensor t = result;
  return [t, size]() mutable { t.div_(size); };
}
}  // namespace

MpiCommunicator::MpiCommunicator(std::shared_ptr<Group> group, int64_t generation,
                                 const Options& options)
    : Communicator(group->rank, group->size, generation, options), group_(std::move(group)) {}

MpiCommunicator::~MpiCommunicator() = default;

void MpiCommunicator::check_usable() const {
  const std::string why = group_->poisoned();
  if (!why.empty())
    throw Error(str_cat("the mpi communicator on rank ", rank(), " is unusable since ", why,
                        " (MPI cannot cancel an op in flight; end the job)"));
}

void MpiCommunicator::do_check(const Call& call) const {
  const char* op = op_name(call.op);
  if (call.input) check_count(*call.input, arg_name(call.op, false));
  if (call.output) {
    check_count(*call.output, arg_name(call.op, true));
    KRAB_CHECK_ARG(!overlaps(*call.input, *call.output), op, " input and output must not overlap");
  }
  if (call.op == OpKind::kSend || call.op == OpKind::kRecv) check_tag(call.tag, op);
  if (call.input) {
    const std::string name = arg_name(call.op, false);
    if (call.op == OpKind::kAllreduce || call.op == OpKind::kReduceScatter)
      Runtime::get().reduce_type(call.input->scalar_type(), name.c_str());
    else
      element_type(*call.input, name);
  }
  check_usable();
}

std::vector<std::string> MpiCommunicator::do_exchange(OpKind op, int64_t seq,
                                                      const std::string& mine) {
  // A fixed-size slot per rank, all-gathered like any collective; longer descriptions are cut,
  // the same way on every rank.
  constexpr int kLen = 96;
  const size_t len = std::min<size_t>(mine.size(), kLen - 1);
  at::Tensor table = at::zeros({size() * kLen}, at::kByte);
  char* all = static_cast<char*>(table.data_ptr());
  std::memcpy(all + rank() * kLen, mine.data(), len);
  const MPI_Comm comm = group_->comm;
  start(group_, str_cat("debug check of ", op_name(op), " #", seq, " on rank ", rank()),
        kCollectiveHint, options().timeout, {table},
        [&](MPI_Request* r) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, all, kLen, MPI_BYTE, comm, r);
        })
      ->wait();
  std::vector<std::string> descriptions;
  for (int r = 0; r < size(); ++r) descriptions.emplace_back(all + r * kLen);
  return descriptions;
}

WorkPtr MpiCommunicator::do_allreduce(at::Tensor& tensor, ReduceOp op, int64_t seq) {
  const MPI_Datatype type = Runtime::get().reduce_type(tensor.scalar_type(), "allreduce tensor");
  const MPI_Op mpi_op = Runtime::get().reduce_op(op, tensor.scalar_type());
  void* data = tensor.data_ptr();
  const int count = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  return start(
      group_, str_cat("allreduce #", seq, " on rank ", rank()), kCollectiveHint, options().timeout,
      {tensor},
      [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op, comm, r);
      },
      average_step(op, tensor, size()));
}

WorkPtr MpiCommunicator::do_allgather(const at::Tensor& input, at::Tensor& output, int64_t seq) {
  const MPI_Datatype type = element_type(input, "allgather input");
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const int n = static_cast<int>(input.numel());
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("allgather #", seq, " on rank ", rank()), kCollectiveHint,
               options().timeout, {input, output},
               [&](MPI_Request* r) { return MPI_Iallgather(in, n, type, out, n, type, comm, r); });
}

WorkPtr MpiCommunicator::do_reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                                           int64_t seq) {
  const MPI_Datatype type = Runtime::get().reduce_type(input.scalar_type(), "reduce_scatter input");
  const MPI_Op mpi_op = Runtime::get().reduce_op(op, input.scalar_type());
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const int n = static_cast<int>(output.numel());
  const MPI_Comm comm = group_->comm;
  return start(
      group_, str_cat("reduce_scatter #", seq, " on rank ", rank()), kCollectiveHint,
      options().timeout, {input, output},
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(in, out, n, type, mpi_op, comm, r); },
      average_step(op, output, size()));
}

WorkPtr MpiCommunicator::do_alltoall(const at::Tensor& input, at::Tensor& output, int64_t seq) {
  const MPI_Datatype type = element_type(input, "alltoall input");
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const int n = static_cast<int>(input.numel() / size());
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("alltoall #", seq, " on rank ", rank()), kCollectiveHint,
               options().timeout, {input, output},
               [&](MPI_Request* r) { return MPI_Ialltoall(in, n, type, out, n, type, comm, r); });
}

WorkPtr MpiCommunicator::do_broadcast(at::Tensor& tensor, int root, int64_t seq) {
  const MPI_Datatype type = element_type(tensor, "broadcast tensor");
  void* data = tensor.data_ptr();
  const int n = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("broadcast #", seq, " from root ", root, " on rank ", rank()),
               kCollectiveHint, options().timeout, {tensor},
               [&](MPI_Request* r) { return MPI_Ibcast(data, n, type, root, comm, r); });
}

WorkPtr MpiCommunicator::do_send(const at::Tensor& tensor, int dst, int tag, int64_t seq) {
  const MPI_Datatype type = element_type(tensor, "send tensor");
  const void* data = tensor.data_ptr();
  const int n = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  // Zero-element messages are still sent: they cost nothing and keep the receiver's matching
  // (and its element-count check) honest.
  return start(group_,
               str_cat("send to rank ", dst, " (tag ", tag, ") on rank ", rank(),
                       ", next collective #", seq),
               "the receiver has not posted the matching recv", options().timeout, {tensor},
               [&](MPI_Request* r) { return MPI_Isend(data, n, type, dst, tag, comm, r); });
}

WorkPtr MpiCommunicator::do_recv(at::Tensor& tensor, int src, int tag, int64_t seq) {
  const MPI_Datatype type = element_type(tensor, "recv tensor");
  void* data = tensor.data_ptr();
  const int n = static_cast<int>(tensor.numel());
  const MPI_Comm comm = group_->comm;
  return start(
      group_,
      str_cat("recv from rank ", src, " (tag ", tag, ") on rank ", rank(), ", next collective #",
              seq),
      "the sender has not sent it", options().timeout, {tensor},
      [&](MPI_Request* r) { return MPI_Irecv(data, n, type, src, tag, comm, r); }, nullptr, type,
      n);
}

WorkPtr MpiCommunicator::do_barrier(int64_t seq) {
  const MPI_Comm comm = group_->comm;
  return start(group_, str_cat("barrier #", seq, " on rank ", rank()), kCollectiveHint,
               options().timeout, {}, [&](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
}

namespace {
// This rank's place in the group of its color, as MPI_Comm_split orders it: (key, old rank).
// `table` holds every rank's (color, key). Returns (new rank, members).
std::pair<int, int> place_in_split(const int32_t* table, int size, int rank, int color, int key) {
  int members = 0, new_rank = 0;
  for (int r = 0; r < size; ++r) {
    if (color < 0 || table[2 * r] != color) continue;
    if (table[2 * r + 1] < key || (table[2 * r + 1] == key && r < rank)) ++new_rank;
    ++members;
  }
  return {new_rank, members};
}
}  // namespace

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key) {
  check_usable();
  // MPI_Comm_split blocks without a timeout, so first make sure every rank has arrived: an
  // all-gather of (color, key) that is polled under the timeout like any other op.
  at::Tensor table = at::zeros({size() * 2}, at::kInt);
  int32_t* all = table.data_ptr<int32_t>();
  all[2 * rank()] = color;
  all[2 * rank() + 1] = key;
  const MPI_Comm comm = group_->comm;
  start(group_, str_cat("split (color ", color, ", key ", key, ") on rank ", rank()),
        kCollectiveHint, options().timeout, {table},
        [&](MPI_Request* r) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_INT32_T, all, 2, MPI_INT32_T, comm, r);
        })
      ->wait();
  const auto [new_rank, members] = place_in_split(all, size(), rank(), color, key);
  MPI_Comm sub = MPI_COMM_NULL;
  int rc;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    rc = MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (rc == MPI_SUCCESS && sub != MPI_COMM_NULL) MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  }
  if (rc != MPI_SUCCESS)
    throw Error(str_cat("split on rank ", rank(), " failed (backend mpi): ", mpi_error_string(rc)));
  if (sub == MPI_COMM_NULL) return nullptr;
  int r = 0, s = 0;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_rank(sub, &r);
    MPI_Comm_size(sub, &s);
  }
  KRAB_CHECK(r == new_rank && s == members, "MPI_Comm_split gave rank ", r, " of ", s,
             ", expected ", new_rank, " of ", members);
  return std::make_unique<MpiCommunicator>(std::make_shared<Group>(sub, r, s), generation(),
                                           options());
}

// ---- Factory and process-level helpers ----

std::unique_ptr<Communicator> make_mpi_communicator(const Options& options, int64_t generation) {
  KRAB_CHECK_ARG(generation >= 0, "generation must be >= 0, got ", generation);
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
        throw Timeout(str_cat("building the mpi group (generation ", generation, ", ", size,
                              " ranks) on rank ", rank, " timed out after ",
                              options.timeout.count() / 1000.0,
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
      std::make_shared<MpiCommunicator::Group>(comm, rank, size), generation, options);
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
