// Communicator::abort in the frame every backend shares, and comm::Reaper, against a fake
// backend that needs no network: each expectation is counted at the backend's hooks (what
// reached it), so "refused without a sequence number, traffic or a launch" is observed, not
// assumed. The Gloo backend's own abortable waits are in gloo_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "comm/reaper.h"
#include "core/errors.h"

namespace krab::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A backend whose ops complete at once; it counts what reached it.
class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size, const Options& options = {})
      : Communicator(rank, size, 0, options) {}
  std::string backend() const override { return "fake"; }

  std::atomic<int> entered{0};  // do_enter: sequence numbers taken
  std::atomic<int> started{0};  // do_*: ops that reached the backend

 protected:
  void do_enter(OpKind, int64_t) override { ++entered; }
  std::vector<std::string> do_exchange(OpKind, int64_t, const std::string& mine) override {
    return std::vector<std::string>(size(), mine);
  }
  WorkPtr start() {
    ++started;
    return completed();
  }
  WorkPtr do_allreduce(at::Tensor&, ReduceOp, int64_t) override { return start(); }
  WorkPtr do_allgather(const at::Tensor&, at::Tensor&, int64_t) override { return start(); }
  WorkPtr do_reduce_scatter(const at::Tensor&, at::Tensor&, ReduceOp, int64_t) override {
    return start();
  }
  WorkPtr do_alltoall(const at::Tensor&, at::Tensor&, int64_t) override { return start(); }
  WorkPtr do_broadcast(at::Tensor&, int, int64_t) override { return start(); }
  WorkPtr do_send(const at::Tensor&, int, int, int64_t) override { return start(); }
  WorkPtr do_recv(at::Tensor&, int, int, int64_t) override { return start(); }
  WorkPtr do_barrier(int64_t) override { return start(); }
  std::unique_ptr<Communicator> do_split(int, int) override {
    ++started;
    return nullptr;
  }
};

// Expects `work` to be complete and to fail at wait() with MembershipChanged(reason), twice.
void expect_refused(const WorkPtr& work, const std::string& reason, const char* op) {
  ASSERT_NE(work, nullptr) << op;
  EXPECT_TRUE(work->is_completed()) << op;
  for (int i = 0; i < 2; ++i) {
    try {
      work->wait();
      ADD_FAILURE() << op << ": wait() after abort returned";
    } catch (const MembershipChanged& e) {
      EXPECT_EQ(e.reason(), reason) << op;
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

TEST(Abort, RefusesNewOpsAtWaitWithoutSequenceNumberTrafficOrLaunch) {
  FakeCommunicator c(0, 3);
  auto t = torch::ones({6});
  c.allreduce(t)->wait();
  ASSERT_EQ(c.entered.load(), 1);
  ASSERT_EQ(c.started.load(), 1);
  const TrafficStats before = c.traffic();
  EXPECT_FALSE(c.aborted());

  c.abort("rank 2 died");
  EXPECT_TRUE(c.aborted());
  auto out = torch::empty({18});
  auto two = torch::empty({2});
  auto empty = torch::empty({0});
  // Launching never throws: each op hands back a Work that fails where the caller waits.
  expect_refused(c.allreduce(t), "rank 2 died", "allreduce");
  expect_refused(c.allreduce(empty), "rank 2 died", "allreduce of nothing");
  expect_refused(c.allgather(t, out), "rank 2 died", "allgather");
  expect_refused(c.reduce_scatter(t, two), "rank 2 died", "reduce_scatter");
  auto same = torch::empty({6});
  expect_refused(c.alltoall(t, same), "rank 2 died", "alltoall");
  expect_refused(c.broadcast(t, 1), "rank 2 died", "broadcast");
  expect_refused(c.send(t, 1), "rank 2 died", "send");
  expect_refused(c.recv(t, 2), "rank 2 died", "recv");
  expect_refused(c.barrier(), "rank 2 died", "barrier");
  EXPECT_THROW(c.split(0, 0), MembershipChanged);

  EXPECT_EQ(c.entered.load(), 1) << "a refused op took a sequence number";
  EXPECT_EQ(c.started.load(), 1) << "a refused op reached the backend";
  const TrafficStats after = c.traffic();
  EXPECT_EQ(after.bytes_sent, before.bytes_sent);
  EXPECT_EQ(after.ops, before.ops);
}

TEST(Abort, IsAPeerLostAndKeepsTheFirstReason) {
  FakeCommunicator c(1, 2);
  c.abort("freeze of rank 0");
  c.abort("later");
  auto t = torch::ones({4});
  try {
    c.allreduce(t)->wait();
    ADD_FAILURE() << "wait() after abort returned";
  } catch (const PeerLost& e) {  // code that catches PeerLost today still catches it
    EXPECT_EQ(std::string(e.what()), "the group was aborted: freeze of rank 0");
    EXPECT_EQ(e.exit_code(), 1);
  }
}

TEST(Abort, ArgumentMistakesStillThrowAtLaunch) {
  FakeCommunicator c(0, 2);
  c.abort("test");
  auto strided = torch::ones({4, 4}).t();
  EXPECT_THROW(c.allreduce(strided), InvalidArgument);
  auto t = torch::ones({4});
  EXPECT_THROW(c.send(t, 0), InvalidArgument);  // to itself
  EXPECT_THROW(c.broadcast(t, 5), InvalidArgument);
  auto ints = torch::ones({4}, torch::kInt64);
  EXPECT_THROW(c.allreduce(ints, ReduceOp::kAvg), InvalidArgument);
}

TEST(Abort, GroupOfOneIsRefusedToo) {
  FakeCommunicator c(0, 1);
  auto t = torch::ones({3});
  c.allreduce(t)->wait();  // completes in the frame: nothing reaches the backend
  EXPECT_EQ(c.started.load(), 0);
  c.abort("leave");
  expect_refused(c.allreduce(t), "leave", "allreduce in a group of one");
  expect_refused(c.barrier(), "leave", "barrier in a group of one");
  EXPECT_EQ(c.entered.load(), 1);
}

// abort() from another thread while the training thread launches: each op either reached the
// backend and succeeded, or was refused and failed at wait — never both, never neither — and
// after the first refusal nothing succeeds again. (Under TSan this also checks the frame's
// shared state is synchronised.)
TEST(Abort, RacingAbortSplitsOpsIntoRunThenRefused) {
  FakeCommunicator c(0, 2);
  constexpr int kBefore = 1000;  // ops launched before the other thread aborts
  constexpr int kRefused = 100;  // refusals seen before the loop stops
  std::atomic<int> launched{0};
  std::thread aborter([&] {
    while (launched.load() < kBefore) std::this_thread::yield();
    c.abort("race");
  });
  int ran = 0, refused = 0;
  bool ran_after_refusal = false;
  auto t = torch::ones({2});
  const auto t0 = Clock::now();
  while (refused < kRefused && ms_since(t0) < 5000) {
    auto w = c.allreduce(t);
    ++launched;
    try {
      w->wait();
      ++ran;
      ran_after_refusal = ran_after_refusal || refused > 0;
    } catch (const MembershipChanged&) {
      ++refused;
    }
  }
  aborter.join();
  EXPECT_EQ(refused, kRefused);
  EXPECT_EQ(ran + refused, launched.load());
  EXPECT_EQ(ran, c.started.load());
  EXPECT_EQ(ran, c.entered.load());
  EXPECT_GE(ran, kBefore);
  EXPECT_FALSE(ran_after_refusal);
  EXPECT_EQ(c.traffic().ops[static_cast<int>(OpKind::kAllreduce)], static_cast<uint64_t>(ran));
}

// ---- Reaper ----

// A latch the fake's destructor blocks on, as a Gloo group's does on an op a frozen peer
// holds. Shared, so a destructor still blocked on a detached reaper thread outlives the test
// body safely.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::vector<int> destroyed;  // ids, in the order their destructors finished
  std::thread::id destroyer;
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  bool wait_destroyed(size_t n, std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, bound, [&] { return destroyed.size() >= n; });
  }
};

class BlockingCommunicator : public FakeCommunicator {
 public:
  BlockingCommunicator(std::shared_ptr<Gate> gate, int id, std::chrono::milliseconds timeout)
      : FakeCommunicator(0, 2, with_timeout(timeout)), gate_(std::move(gate)), id_(id) {}
  ~BlockingCommunicator() override {
    std::unique_lock<std::mutex> lock(gate_->mu);
    gate_->cv.wait_for(lock, 10s, [&] { return gate_->open; });
    gate_->destroyed.push_back(id_);
    gate_->destroyer = std::this_thread::get_id();
    gate_->cv.notify_all();
  }

 private:
  static Options with_timeout(std::chrono::milliseconds timeout) {
    Options o;
    o.timeout = timeout;
    return o;
  }
  std::shared_ptr<Gate> gate_;
  int id_;
};

TEST(Reaper, BuryReturnsAtOnceAndDestroysInOrderOffTheCaller) {
  auto gate = std::make_shared<Gate>();
  Reaper reaper(2s);
  const auto t0 = Clock::now();
  reaper.bury(std::make_unique<BlockingCommunicator>(gate, 1, 60s));
  reaper.bury(std::make_unique<BlockingCommunicator>(gate, 2, 60s));
  reaper.bury(nullptr);  // ignored
  EXPECT_LT(ms_since(t0), 200.0) << "bury() waited for a destructor";
  EXPECT_EQ(reaper.pending(), 2u);
  EXPECT_FALSE(reaper.wait_idle(50ms));
  gate->release();
  EXPECT_TRUE(reaper.wait_idle(2s));
  EXPECT_EQ(reaper.pending(), 0u);
  std::lock_guard<std::mutex> lock(gate->mu);
  EXPECT_EQ(gate->destroyed, (std::vector<int>{1, 2}));
  EXPECT_NE(gate->destroyer, std::this_thread::get_id());
}

TEST(Reaper, ExitWaitsForWhatFinishesWithinTheBound) {
  auto gate = std::make_shared<Gate>();
  gate->release();  // destructors return at once
  {
    Reaper reaper;  // default bound: Reaper::kExitBound
    reaper.bury(std::make_unique<BlockingCommunicator>(gate, 7, 100ms));
  }  // joined: the destructor ran before the Reaper was gone
  std::lock_guard<std::mutex> lock(gate->mu);
  EXPECT_EQ(gate->destroyed, std::vector<int>{7});
}

TEST(Reaper, ExitGivesUpAtItsBound) {
  auto gate = std::make_shared<Gate>();
  const auto t0 = Clock::now();
  {
    Reaper reaper(200ms);
    reaper.bury(std::make_unique<BlockingCommunicator>(gate, 1, 60s));
  }
  const double explicit_ms = ms_since(t0);
  EXPECT_GE(explicit_ms, 190.0);
  EXPECT_LT(explicit_ms, 1000.0) << "the exit waited past its bound";

  // Without an explicit bound: 1 s, however long the buried groups' own timeouts (an op held
  // by a peer cut off ends only at its timeout; the leaving process does not wait for it).
  const auto t1 = Clock::now();
  {
    Reaper reaper;
    reaper.bury(std::make_unique<BlockingCommunicator>(gate, 2, 60s));
    reaper.bury(std::make_unique<BlockingCommunicator>(gate, 3, 30s));
  }
  const double default_ms = ms_since(t1);
  EXPECT_GE(default_ms, 990.0);
  EXPECT_LT(default_ms, 2500.0) << "the exit waited past its bound";

  // The detached threads finish once the blocked destructors return.
  gate->release();
  EXPECT_TRUE(gate->wait_destroyed(3, 5s));
}

}  // namespace
}  // namespace krab::comm
