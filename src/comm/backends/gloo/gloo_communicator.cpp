#include "comm/backends/gloo/gloo_communicator.h"

#include <arpa/inet.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <sstream>
#include <thread>

#include "comm/peer_monitor.h"
#include "core/errors.h"

namespace krab::comm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return c10d::ReduceOp::SUM;  // kAvg divides afterwards
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

// A completed, error-free handle (empty tensors, zero-byte ops).
class DoneWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// Wraps a c10d work: waits with the group's timeout, runs the op's finishing step (e.g. the
// division of an average), and turns Gloo's anonymous errors into ones that name ranks.
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, OpKind op, int64_t seq, int rank,
           std::chrono::milliseconds timeout, std::shared_ptr<PeerMonitor> monitor,
           std::function<void()> finish)
      : work_(std::move(work)), op_(op), seq_(seq), rank_(rank), timeout_(timeout),
        monitor_(std::move(monitor)), finish_(std::move(finish)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      try {
        if (!work_->wait(timeout_)) throw std::runtime_error("timed out");
        if (finish_) finish_();
      } catch (const std::exception& e) {
        error_ = diagnose(e.what());
      }
      done_ = true;
      work_.reset();
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ || work_->isCompleted();
  }

 private:
  std::exception_ptr diagnose(const std::string& cause) {
    const std::string what = str_cat(op_name(op_), " #", seq_, " on rank ", rank_);
    const std::string short_cause = cause.substr(0, cause.find('\n')).substr(0, 160);
    auto peers = monitor_ ? monitor_->diagnose() : std::vector<PeerMonitor::PeerState>{};
    std::vector<int> dead, absent;
    for (const auto& p : peers) {
      if (p.rank == rank_) continue;
      if (!p.alive) dead.push_back(p.rank);
      else if (p.seq < seq_) absent.push_back(p.rank);
    }
    if (!dead.empty())
      return std::make_exception_ptr(PeerLost(str_cat(
          what, " failed: ", describe_ranks(dead), " stopped responding (process died or "
          "froze); gloo: ", short_cause)));
    const bool timed_out = cause.find("imed out") != std::string::npos ||
                           cause.find("imeout") != std::string::npos;
    if (!absent.empty()) {
      std::ostringstream os;
      os << what << (timed_out ? " timed out after " : " failed; ") ;
      if (timed_out) os << timeout_.count() / 1000.0 << " s: ";
      os << describe_ranks(absent) << " never joined it (";
      bool first = true;
      for (const auto& p : peers)
        if (std::find(absent.begin(), absent.end(), p.rank) != absent.end()) {
          os << (first ? "" : ", ") << "rank " << p.rank << " is at #" << p.seq << " " << p.op;
          first = false;
        }
      os << ")";
      return timed_out ? std::make_exception_ptr(Timeout(os.str()))
                       : std::make_exception_ptr(Error(os.str()));
    }
    if (timed_out)
      return std::make_exception_ptr(
          Timeout(str_cat(what, " timed out after ", timeout_.count() / 1000.0,
                          " s; every rank joined it; gloo: ", short_cause)));
    return std::make_exception_ptr(Error(str_cat(what, " failed: ", short_cause)));
  }

  std::mutex mu_;
  c10::intrusive_ptr<c10d::Work> work_;
  OpKind op_;
  int64_t seq_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<PeerMonitor> monitor_;
  std::function<void()> finish_;
  bool done_ = false;
  std::exception_ptr error_;
};

void check_tensor(const at::Tensor& t, const char* name) {
  KRAB_CHECK_ARG(t.defined(), name, " is undefined");
  KRAB_CHECK_ARG(t.is_contiguous(), name, " must be contiguous");
  KRAB_CHECK_ARG(t.device().is_cpu(), name, " must be a CPU tensor for the gloo backend");
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::function<StorePtr()> connect, const std::string& prefix,
                                   int rank, int size, int64_t generation,
                                   const std::string& address, const Options& options)
    : connect_(std::move(connect)), prefix_(prefix), rank_(rank), size_(size),
      generation_(generation), address_(address), options_(options) {
  KRAB_CHECK_ARG(size >= 1, "group size must be >= 1, got ", size);
  KRAB_CHECK_ARG(rank >= 0 && rank < size, "rank ", rank, " is outside 0..", size - 1);
  store_ = prefixed(prefix_, connect_());
  store_->setTimeout(options_.timeout);
  auto base_connect = connect_;
  const std::string mon_prefix = prefix_;
  monitor_ = std::make_shared<PeerMonitor>(
      [base_connect, mon_prefix] { return prefixed(mon_prefix, base_connect()); }, rank, size);

  auto opts = c10d::ProcessGroupGloo::Options::create(options_.timeout);
  opts->devices.push_back(is_ipv4(address_)
                              ? c10d::ProcessGroupGloo::createDeviceForHostname(address_)
                              : c10d::ProcessGroupGloo::createDeviceForInterface(address_));
  opts->threads = 1;  // one progress thread: our ops are issued in order from one thread
  try {
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed("pg/", store_), rank, size, opts);
  } catch (const std::exception& e) {
    // Find out who never arrived: their heartbeat keys are missing.
    auto peers = monitor_->diagnose();
    std::vector<int> missing;
    for (const auto& p : peers)
      if (p.rank != rank && (!p.reported || !p.alive)) missing.push_back(p.rank);
    std::string who = missing.empty() ? "" : str_cat(describe_ranks(missing), " did not join; ");
    // c10's message carries a C++ backtrace after its first line: keep the line.
    const std::string cause = e.what();
    throw Timeout(str_cat("building the gloo group (generation ", generation, ", ", size,
                          " ranks) failed on rank ", rank, ": ", who,
                          cause.substr(0, cause.find('\n')).substr(0, 160)));
  }
}

GlooCommunicator::~GlooCommunicator() = default;

int64_t GlooCommunicator::begin(OpKind op, const at::Tensor* tensor) {
  const int64_t seq = seq_++;
  monitor_->enter(seq, op_name(op));
  if (options_.debug_checks) {
    // Every rank publishes what it is about to run and compares with everybody else's.
    const std::string mine = str_cat(op_name(op), " ", tensor ? describe(*tensor) : "-");
    store_->set(str_cat("dbg/", seq, "/", rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::string key = str_cat("dbg/", seq, "/", r);
      store_->wait({key}, options_.timeout);
      auto v = store_->get(key);
      std::string theirs(v.begin(), v.end());
      if (theirs != mine)
        throw Error(str_cat("collective mismatch at #", seq, ": rank ", rank_, " called ", mine,
                            " but rank ", r, " called ", theirs));
    }
  }
  return seq;
}

void GlooCommunicator::count(OpKind op, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  traffic_.add(op, bytes);
}

TrafficStats GlooCommunicator::traffic() const {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  return traffic_;
}

WorkPtr GlooCommunicator::allreduce(at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce tensor");
  KRAB_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                 "allreduce average needs a floating-point tensor, got ", tensor.scalar_type());
  const int64_t seq = begin(OpKind::kAllreduce, &tensor);
  const uint64_t n = tensor.nbytes();
  count(OpKind::kAllreduce, size_ > 1 ? 2 * (size_ - 1) * n / size_ : 0);
  if (tensor.numel() == 0 || size_ == 1) return std::make_shared<DoneWork>();
  std::vector<at::Tensor> ts{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  auto w = pg_->allreduce(ts, o);
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) {
    at::Tensor t = tensor;
    const int w_size = size_;
    finish = [t, w_size]() mutable { t.div_(w_size); };
  }
  return std::make_shared<GlooWork>(w, OpKind::kAllreduce, seq, rank_, options_.timeout, monitor_,
                                    std::move(finish));
}

WorkPtr GlooCommunicator::allgather(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "allgather input");
  check_tensor(output, "allgather output");
  KRAB_CHECK_ARG(output.numel() == input.numel() * size_, "allgather output must have ",
                 input.numel() * size_, " elements (size x input), got ", output.numel());
  KRAB_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "allgather output dtype must match the input's");
  const int64_t seq = begin(OpKind::kAllgather, &input);
  count(OpKind::kAllgather, static_cast<uint64_t>(size_ - 1) * input.nbytes());
  const int64_t n = input.numel();
  if (n == 0) return std::make_shared<DoneWork>();
  at::Tensor flat_out = output.view({-1});
  if (size_ == 1) {
    flat_out.copy_(input.view({-1}));
    return std::make_shared<DoneWork>();
  }
  std::vector<at::Tensor> outs;
  for (int r = 0; r < size_; ++r) outs.push_back(flat_out.narrow(0, r * n, n));
  std::vector<std::vector<at::Tensor>> outputs{outs};
  std::vector<at::Tensor> inputs{input.view({-1})};
  auto w = pg_->allgather(outputs, inputs);
  return std::make_shared<GlooWork>(w, OpKind::kAllgather, seq, rank_, options_.timeout, monitor_,
                                    nullptr);
}

WorkPtr GlooCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                         ReduceOp op) {
  check_tensor(input, "reduce_scatter input");
  check_tensor(output, "reduce_scatter output");
  KRAB_CHECK_ARG(input.numel() == output.numel() * size_, "reduce_scatter input must have ",
                 output.numel() * size_, " elements (size x output), got ", input.numel());
  KRAB_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "reduce_scatter output dtype must match the input's");
  KRAB_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(input.scalar_type()),
                 "reduce_scatter average needs a floating-point tensor");
  const int64_t seq = begin(OpKind::kReduceScatter, &input);
  const int64_t n = output.numel();
  count(OpKind::kReduceScatter, static_cast<uint64_t>(size_ - 1) * output.nbytes());
  if (n == 0) return std::make_shared<DoneWork>();
  at::Tensor in = input.view({-1});
  if (size_ == 1) {
    output.view({-1}).copy_(in);
    return std::make_shared<DoneWork>();
  }
  // All-to-all: chunk r of every rank lands in rank r's staging buffer; then reduce locally.
  at::Tensor staging = at::empty({size_ * n}, input.options());
  std::vector<int64_t> splits;
  auto w = pg_->alltoall_base(staging, in, splits, splits);
  at::Tensor out = output;
  const int w_size = size_;
  auto finish = [staging, out, op, n, w_size]() mutable {
    at::Tensor chunks = staging.view({w_size, n});
    at::Tensor flat = out.view({-1});
    switch (op) {
      case ReduceOp::kSum: at::sum_out(flat, chunks, {0}); break;
      case ReduceOp::kAvg: at::sum_out(flat, chunks, {0}); flat.div_(w_size); break;
      case ReduceOp::kMax: flat.copy_(std::get<0>(chunks.max(0))); break;
      case ReduceOp::kMin: flat.copy_(std::get<0>(chunks.min(0))); break;
    }
  };
  return std::make_shared<GlooWork>(w, OpKind::kReduceScatter, seq, rank_, options_.timeout,
                                    monitor_, finish);
}

WorkPtr GlooCommunicator::alltoall(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "alltoall input");
  check_tensor(output, "alltoall output");
  check_alltoall_sizes(input, output, size_);
  const int64_t seq = begin(OpKind::kAlltoall, &input);
  count(OpKind::kAlltoall, static_cast<uint64_t>(size_ - 1) * input.nbytes() / size_);
  if (input.numel() == 0) return std::make_shared<DoneWork>();
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  if (size_ == 1) {
    out.copy_(in);
    return std::make_shared<DoneWork>();
  }
  std::vector<int64_t> splits;  // empty: equal chunks
  auto w = pg_->alltoall_base(out, in, splits, splits);
  return std::make_shared<GlooWork>(w, OpKind::kAlltoall, seq, rank_, options_.timeout, monitor_,
                                    nullptr);
}

WorkPtr GlooCommunicator::broadcast(at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast tensor");
  KRAB_CHECK_ARG(root >= 0 && root < size_, "broadcast root ", root, " is outside 0..", size_ - 1);
  const int64_t seq = begin(OpKind::kBroadcast, &tensor);
  count(OpKind::kBroadcast, rank_ == root ? static_cast<uint64_t>(size_ - 1) * tensor.nbytes() : 0);
  if (tensor.numel() == 0 || size_ == 1) return std::make_shared<DoneWork>();
  std::vector<at::Tensor> ts{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto w = pg_->broadcast(ts, o);
  return std::make_shared<GlooWork>(w, OpKind::kBroadcast, seq, rank_, options_.timeout, monitor_,
                                    nullptr);
}

WorkPtr GlooCommunicator::send(const at::Tensor& tensor, int dst, int tag) {
  check_tensor(tensor, "send tensor");
  KRAB_CHECK_ARG(dst >= 0 && dst < size_ && dst != rank_, "send destination ", dst,
                 " must be another rank in 0..", size_ - 1);
  count(OpKind::kSend, tensor.nbytes());
  if (tensor.numel() == 0) return std::make_shared<DoneWork>();
  std::vector<at::Tensor> ts{tensor};
  auto w = pg_->send(ts, dst, tag);
  return std::make_shared<GlooWork>(w, OpKind::kSend, seq_, rank_, options_.timeout, monitor_,
                                    nullptr);
}

WorkPtr GlooCommunicator::recv(at::Tensor& tensor, int src, int tag) {
  check_tensor(tensor, "recv tensor");
  KRAB_CHECK_ARG(src >= 0 && src < size_ && src != rank_, "recv source ", src,
                 " must be another rank in 0..", size_ - 1);
  count(OpKind::kRecv, 0);
  if (tensor.numel() == 0) return std::make_shared<DoneWork>();
  std::vector<at::Tensor> ts{tensor};
  auto w = pg_->recv(ts, src, tag);
  return std::make_shared<GlooWork>(w, OpKind::kRecv, seq_, rank_, options_.timeout, monitor_,
                                    nullptr);
}

WorkPtr GlooCommunicator::barrier() {
  const int64_t seq = begin(OpKind::kBarrier, nullptr);
  count(OpKind::kBarrier, 0);
  if (size_ == 1) return std::make_shared<DoneWork>();
  auto w = pg_->barrier();
  return std::make_shared<GlooWork>(w, OpKind::kBarrier, seq, rank_, options_.timeout, monitor_,
                                    nullptr);
}

std::unique_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  // Every rank publishes (color, key); each then derives the same membership locally.
  const int64_t id = splits_++;
  const std::string base = str_cat("split", id, "/");
  const std::string mine = str_cat(color, " ", key);
  store_->set(base + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::tuple<int, int>> members;  // (key, rank) of my color
  for (int r = 0; r < size_; ++r) {
    const std::string k = base + std::to_string(r);
    store_->wait({k}, options_.timeout);
    auto v = store_->get(k);
    std::istringstream in(std::string(v.begin(), v.end()));
    int c = 0, kk = 0;
    in >> c >> kk;
    if (c == color && color >= 0) members.emplace_back(kk, r);
  }
  if (color < 0) return nullptr;
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (std::get<1>(members[i]) == rank_) new_rank = static_cast<int>(i);
  return std::make_unique<GlooCommunicator>(connect_, str_cat(prefix_, base, "c", color, "/"),
                                            new_rank, static_cast<int>(members.size()),
                                            generation_, address_, options_);
}

}  // namespace krab::comm
