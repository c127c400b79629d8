#include "comm/backends/gloo/gloo_communicator.h"

#include <arpa/inet.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/peer_monitor.h"
#include "core/errors.h"

namespace krab::comm {

// Everything a GlooWork needs from its group, shared by every Work of the group (and kept alive
// by them after the group is gone).
struct WorkContext {
  int rank = 0;
  int64_t generation = 0;
  Options options;
  std::shared_ptr<PeerMonitor> monitor;
  std::shared_ptr<AbortSignal> abort;
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return c10d::ReduceOp::SUM;  // kAvg divides afterwards
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}

// The first line of a c10d message (which carries a C++ backtrace after it), bounded.
std::string first_line(const std::string& cause) {
  return cause.substr(0, cause.find('\n')).substr(0, 160);
}

bool looks_timed_out(const std::string& cause) {
  return cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
}

// What an exception_ptr says (c10d stores a failed op's error as one).
std::string message_of(const std::exception_ptr& error) {
  if (!error) return "unknown error";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "unknown error";
}

// How long one slice of an abortable wait lasts: the longest an abort() goes unnoticed.
constexpr std::chrono::milliseconds kWaitSlice{50};

// Wraps a c10d work: waits with the group's timeout, runs the op's finishing step (e.g. the
// division of an average), and turns Gloo's anonymous errors into ones that name ranks — or,
// on an abortable group, waits in slices and reports instead of diagnosing.
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, OpKind op, int64_t seq,
           std::shared_ptr<const WorkContext> context, std::function<void()> finish)
      : work_(std::move(work)),
        op_(op),
        seq_(seq),
        context_(std::move(context)),
        finish_(std::move(finish)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      error_ = context_->options.abortable ? wait_in_slices() : wait_once();
      done_ = true;
      // The group's worker thread holds its own reference to a pending op (and its tensors).
      work_.reset();
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ || work_->isCompleted();
  }

 private:
  // Today's wait: one blocking wait up to the timeout, then the diagnosis on failure. An
  // aborted group's result is never returned, whatever the op did.
  std::exception_ptr wait_once() {
    const auto& abort = *context_->abort;
    if (abort.raised()) return abort.error();
    std::exception_ptr error;
    try {
      if (!work_->wait(context_->options.timeout)) throw std::runtime_error("timed out");
      if (abort.raised()) return abort.error();
      if (finish_) finish_();
    } catch (const std::exception& e) {
      if (abort.raised()) return abort.error();
      error = diagnose(e.what());
    }
    return error;
  }

  // The abortable wait. c10d's Work::wait(timeout) throws "Operation timed out!" when the slice
  // ends first and may be called again: the op goes on and completes after such waits (design
  // elastic §15.3). Whether the op itself ended, and how, is read from the op (isCompleted,
  // isSuccess, exception) rather than from what a slice threw: an op that completes just after
  // its slice timed out is a success, not an error.
  std::exception_ptr wait_in_slices() {
    const auto& abort = *context_->abort;
    const auto deadline = std::chrono::steady_clock::now() + context_->options.timeout;
    for (;;) {
      if (abort.raised()) return abort.error();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return report("timed out", true);
      try {
        work_->wait(std::min(left, kWaitSlice));
      } catch (const std::exception&) {
      }
      if (!work_->isCompleted()) continue;  // the slice ended, the op goes on
      if (abort.raised()) return abort.error();
      if (!work_->isSuccess()) {
        const std::string cause = first_line(message_of(work_->exception()));
        return report(cause, looks_timed_out(cause));
      }
      try {
        if (finish_) finish_();
      } catch (const std::exception& e) {
        return std::make_exception_ptr(Error(str_cat(what(), " failed: ", e.what())));
      }
      return nullptr;
    }
  }

  // An abortable op failed: tell the callback what this rank knows, and fail without the
  // diagnosis (the keeper names the rank at fault).
  std::exception_ptr report(const std::string& cause, bool timed_out) {
    const Options& o = context_->options;
    std::string callback_failed;
    if (o.on_peer_error) {
      PeerError e{context_->rank, context_->generation, op_, seq_, timed_out, cause};
      try {
        o.on_peer_error(e);
      } catch (const std::exception& x) {
        callback_failed = str_cat("; on_peer_error failed: ", x.what());
      } catch (...) {
        callback_failed = "; on_peer_error failed";
      }
    }
    if (timed_out)
      return std::make_exception_ptr(
          Timeout(str_cat(what(), " timed out after ", o.timeout.count() / 1000.0,
                          " s; gloo: ", cause, callback_failed)));
    return std::make_exception_ptr(
        PeerLost(str_cat(what(), " failed: a peer's link broke; gloo: ", cause, callback_failed)));
  }

  std::string what() const {
    return str_cat(op_name(op_), " #", seq_, " on rank ", context_->rank);
  }

  std::exception_ptr diagnose(const std::string& cause) {
    const std::string what = this->what();
    const std::string short_cause = first_line(cause);
    const int rank = context_->rank;
    const auto timeout = context_->options.timeout;
    const auto& monitor = context_->monitor;
    auto peers = monitor ? monitor->diagnose() : std::vector<PeerMonitor::PeerState>{};
    std::vector<int> dead, absent;
    for (const auto& p : peers) {
      if (p.rank == rank) continue;
      if (!p.alive)
        dead.push_back(p.rank);
      else if (p.seq < seq_)
        absent.push_back(p.rank);
    }
    if (!dead.empty())
      return std::make_exception_ptr(PeerLost(str_cat(what, " failed: ", describe_ranks(dead),
                                                      " stopped responding (process died or "
                                                      "froze); gloo: ",
                                                      short_cause)));
    const bool timed_out = looks_timed_out(cause);
    if (!absent.empty()) {
      std::ostringstream os;
      os << what << (timed_out ? " timed out after " : " failed; ");
      if (timed_out) os << timeout.count() / 1000.0 << " s: ";
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
          Timeout(str_cat(what, " timed out after ", timeout.count() / 1000.0,
                          " s; every rank joined it; gloo: ", short_cause)));
    return std::make_exception_ptr(Error(str_cat(what, " failed: ", short_cause)));
  }

  std::mutex mu_;
  c10::intrusive_ptr<c10d::Work> work_;
  OpKind op_;
  int64_t seq_;
  std::shared_ptr<const WorkContext> context_;
  std::function<void()> finish_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

GlooCommunicator::GlooCommunicator(std::function<StorePtr()> connect, const std::string& prefix,
                                   int rank, int size, int64_t generation,
                                   const std::string& address, const Options& options)
    : Communicator(rank, size, generation, options),
      connect_(std::move(connect)),
      prefix_(prefix),
      address_(address) {
  store_ = prefixed(prefix_, connect_());
  store_->setTimeout(options.timeout);
  auto base_connect = connect_;
  const std::string mon_prefix = prefix_;
  monitor_ = std::make_shared<PeerMonitor>(
      [base_connect, mon_prefix] { return prefixed(mon_prefix, base_connect()); }, rank, size,
      options.heartbeat);
  connect_group();
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::connect_group() {
  auto opts = c10d::ProcessGroupGloo::Options::create(options().timeout);
  opts->devices.push_back(is_ipv4(address_)
                              ? c10d::ProcessGroupGloo::createDeviceForHostname(address_)
                              : c10d::ProcessGroupGloo::createDeviceForInterface(address_));
  opts->threads = 1;  // one progress thread: our ops are issued in order from one thread
  try {
    pg_ =
        c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed("pg/", store_), rank(), size(), opts);
  } catch (const std::exception& e) {
    // Find out who never arrived: their heartbeat keys are missing.
    auto peers = monitor_->diagnose();
    std::vector<int> missing;
    for (const auto& p : peers)
      if (p.rank != rank() && (!p.reported || !p.alive)) missing.push_back(p.rank);
    std::string who = missing.empty() ? "" : str_cat(describe_ranks(missing), " did not join; ");
    // c10's message carries a C++ backtrace after its first line: keep the line.
    const std::string cause = e.what();
    throw Timeout(str_cat("building the gloo group (generation ", generation(), ", ", size(),
                          " ranks) failed on rank ", rank(), ": ", who,
                          cause.substr(0, cause.find('\n')).substr(0, 160)));
  }
}

WorkPtr GlooCommunicator::wrap(c10::intrusive_ptr<c10d::Work> work, OpKind op, int64_t seq,
                               std::function<void()> finish) {
  if (!work_context_) {
    auto c = std::make_shared<WorkContext>();
    c->rank = rank();
    c->generation = generation();
    c->options = options();
    c->monitor = monitor_;
    c->abort = abort_signal();
    work_context_ = std::move(c);
  }
  return std::make_shared<GlooWork>(std::move(work), op, seq, work_context_, std::move(finish));
}

void GlooCommunicator::do_enter(OpKind op, int64_t seq) { monitor_->enter(seq, op_name(op)); }

std::vector<std::string> GlooCommunicator::do_exchange(OpKind, int64_t seq,
                                                       const std::string& mine) {
  store_->set(str_cat("dbg/", seq, "/", rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> all(size());
  all[rank()] = mine;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const std::string key = str_cat("dbg/", seq, "/", r);
    store_->wait({key}, options().timeout);
    auto v = store_->get(key);
    all[r].assign(v.begin(), v.end());
  }
  return all;
}

WorkPtr GlooCommunicator::do_allreduce(at::Tensor& tensor, ReduceOp op, int64_t seq) {
  std::vector<at::Tensor> ts{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  auto w = pg_->allreduce(ts, o);
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) {
    at::Tensor t = tensor;
    const int w_size = size();
    finish = [t, w_size]() mutable { t.div_(w_size); };
  }
  return wrap(w, OpKind::kAllreduce, seq, std::move(finish));
}

WorkPtr GlooCommunicator::do_allgather(const at::Tensor& input, at::Tensor& output, int64_t seq) {
  const int64_t n = input.numel();
  at::Tensor flat_out = output.view({-1});
  std::vector<at::Tensor> outs;
  for (int r = 0; r < size(); ++r) outs.push_back(flat_out.narrow(0, r * n, n));
  std::vector<std::vector<at::Tensor>> outputs{outs};
  std::vector<at::Tensor> inputs{input.view({-1})};
  return wrap(pg_->allgather(outputs, inputs), OpKind::kAllgather, seq);
}

WorkPtr GlooCommunicator::do_reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                            ReduceOp op, int64_t seq) {
  const int64_t n = output.numel();
  const int w_size = size();
  // All-to-all: chunk r of every rank lands in rank r's staging buffer; then reduce locally.
  at::Tensor staging = at::empty({w_size * n}, input.options());
  at::Tensor in = input.view({-1});
  std::vector<int64_t> splits;
  auto w = pg_->alltoall_base(staging, in, splits, splits);
  at::Tensor out = output;
  auto finish = [staging, out, op, n, w_size]() mutable {
    at::Tensor chunks = staging.view({w_size, n});
    at::Tensor flat = out.view({-1});
    switch (op) {
      case ReduceOp::kSum:
        at::sum_out(flat, chunks, {0});
        break;
      case ReduceOp::kAvg:
        at::sum_out(flat, chunks, {0});
        flat.div_(w_size);
        break;
      case ReduceOp::kMax:
        flat.copy_(std::get<0>(chunks.max(0)));
        break;
      case ReduceOp::kMin:
        flat.copy_(std::get<0>(chunks.min(0)));
        break;
    }
  };
  return wrap(w, OpKind::kReduceScatter, seq, finish);
}

WorkPtr GlooCommunicator::do_alltoall(const at::Tensor& input, at::Tensor& output, int64_t seq) {
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  std::vector<int64_t> splits;  // empty: equal chunks
  return wrap(pg_->alltoall_base(out, in, splits, splits), OpKind::kAlltoall, seq);
}

WorkPtr GlooCommunicator::do_broadcast(at::Tensor& tensor, int root, int64_t seq) {
  std::vector<at::Tensor> ts{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  return wrap(pg_->broadcast(ts, o), OpKind::kBroadcast, seq);
}

WorkPtr GlooCommunicator::do_send(const at::Tensor& tensor, int dst, int tag, int64_t seq) {
  if (tensor.numel() == 0) return completed();
  std::vector<at::Tensor> ts{tensor};
  return wrap(pg_->send(ts, dst, tag), OpKind::kSend, seq);
}

WorkPtr GlooCommunicator::do_recv(at::Tensor& tensor, int src, int tag, int64_t seq) {
  if (tensor.numel() == 0) return completed();
  std::vector<at::Tensor> ts{tensor};
  return wrap(pg_->recv(ts, src, tag), OpKind::kRecv, seq);
}

WorkPtr GlooCommunicator::do_barrier(int64_t seq) {
  return wrap(pg_->barrier(), OpKind::kBarrier, seq);
}

std::unique_ptr<Communicator> GlooCommunicator::do_split(int color, int key) {
  // Every rank publishes (color, key); each then derives the same membership locally.
  const int64_t id = splits_++;
  const std::string base = str_cat("split", id, "/");
  const std::string mine = str_cat(color, " ", key);
  store_->set(base + std::to_string(rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::tuple<int, int>> members;  // (key, rank) of my color
  for (int r = 0; r < size(); ++r) {
    const std::string k = base + std::to_string(r);
    store_->wait({k}, options().timeout);
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
    if (std::get<1>(members[i]) == rank()) new_rank = static_cast<int>(i);
  return std::make_unique<GlooCommunicator>(connect_, str_cat(prefix_, base, "c", color, "/"),
                                            new_rank, static_cast<int>(members.size()),
                                            generation(), address_, options());
}

}  // namespace krab::comm
