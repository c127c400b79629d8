// Abortable Gloo groups (elastic membership, design elastic §3): a pending wait ends within a
// slice of abort(), and a group whose peer died or froze is abandoned to the reaper while a
// group of the next generation is built in the same process and works at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "comm/reaper.h"
#include "comm/store.h"
#include "core/errors.h"
#include "gloo_support.h"
#ifdef KRAB_HAVE_SUITE
#include "collective_suite.h"
#endif

namespace krab::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Thread-ranks: rank 1 joins the group but never the all-reduce, so rank 0's wait is pending
// when another thread aborts the group.
TEST(Gloo, AbortFailsPendingWaits) {
  StoreServer server("127.0.0.1", 0, 20s);
  Options o;
  o.timeout = 8s;
  o.abortable = true;
  std::atomic<bool> rank0_done{false};
  std::thread rank1([&] {
    auto c = test_support::join(1, 2, server.port(), o);
    while (!rank0_done) std::this_thread::sleep_for(5ms);
    // Destroying it closes its links, so rank 0's abandoned op fails and its group can close.
  });
  auto c = test_support::join(0, 2, server.port(), o);
  auto t = torch::ones({1024});
  const auto started = Clock::now();
  WorkPtr pending = c->allreduce(t);
  const TrafficStats counted = c->traffic();
  Clock::time_point aborted_at;
  std::thread aborter([&] {
    std::this_thread::sleep_for(300ms);
    aborted_at = Clock::now();
    c->abort("test");
  });
  try {
    pending->wait();
    ADD_FAILURE() << "the pending all-reduce completed without rank 1";
  } catch (const MembershipChanged& e) {
    EXPECT_EQ(e.reason(), "test");
  }
  const auto caught = Clock::now();
  aborter.join();
  EXPECT_GE(seconds_between(started, caught), 0.25) << "the wait did not block";
  const double late = seconds_between(aborted_at, caught);
  std::printf("wait ended %.3f s after abort()\n", late);
  EXPECT_LT(late, 1.0);

  // A new op after the abort: no throw at launch, fails at wait, nothing counted.
  WorkPtr refused;
  ASSERT_NO_THROW(refused = c->allreduce(t));
  EXPECT_TRUE(refused->is_completed());
  EXPECT_THROW(refused->wait(), MembershipChanged);
  EXPECT_EQ(c->traffic().bytes_sent, counted.bytes_sent);
  EXPECT_EQ(c->traffic().ops, counted.ops);
  EXPECT_THROW(pending->wait(), MembershipChanged);  // the same error again

  rank0_done = true;
  rank1.join();
  c.reset();
}

#ifdef KRAB_HAVE_SUITE
// Waiting in slices changes nothing for ops that succeed: the whole suite, abortable.
TEST(Gloo, AbortableGroupPassesTheCollectiveSuite) {
  Options o;
  o.timeout = 20s;
  o.abortable = true;
  test_support::run_ranks_with(
      3, o, [](int, Communicator& c) { krab::testing::run_collective_suite(c); });
}
#endif

// An abortable op that runs out of time fails with Timeout at the timeout, without the
// diagnosis (which would add 0.6-3 s reading heartbeats), after telling on_peer_error.
TEST(Gloo, AbortableTimeoutIsReportedWithoutDiagnosis) {
  Options o;
  o.timeout = 1000ms;  // the store's own timeouts are whole seconds
  o.abortable = true;
  std::atomic<int> reports{0};
  o.on_peer_error = [&](const PeerError& e) {
    EXPECT_EQ(e.rank, 0);
    EXPECT_EQ(e.op, OpKind::kAllreduce);
    EXPECT_EQ(e.seq, 1);
    EXPECT_TRUE(e.timed_out) << e.cause;
    ++reports;
  };
  std::atomic<bool> done{false};
  test_support::run_ranks_with(2, o, [&](int r, Communicator& c) {
    auto t = torch::ones({16});
    c.allreduce(t)->wait();  // #0: both
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(5ms);  // never joins #1
      return;
    }
    const auto t0 = Clock::now();
    EXPECT_THROW(c.allreduce(t)->wait(), Timeout);
    const double took = seconds_between(t0, Clock::now());
    EXPECT_GE(took, 0.95);
    EXPECT_LT(took, 1.5) << "the wait was diagnosed (>= 0.6 s more) or waited past its timeout";
    done = true;
  });
  EXPECT_EQ(reports.load(), 1);
}

// ---- processes: a peer killed or frozen; the survivors rebuild ----

constexpr int kWorld = 4;
constexpr int64_t kElements = 1 << 18;  // 1 MiB of float

// Runs kWorld children; once all have their all-reduces in flight, kills (SIGKILL) or freezes
// (SIGSTOP) `victim`. The survivors check everything themselves and exit 0 (child_rebuild).
void run_rebuild(int victim, bool freeze) {
  StoreServer server("127.0.0.1", 0, 20s);
  auto store = server.store();
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r)
    pids.push_back(test_support::spawn_child(
        {test_support::self_exe(), "--child-rebuild", std::to_string(r), std::to_string(kWorld),
         std::to_string(server.port()), std::to_string(victim), freeze ? "freeze" : "kill"}));
  auto kill_all = [&] {
    for (pid_t p : pids) {
      ::kill(p, SIGCONT);
      ::kill(p, SIGKILL);
    }
  };
  std::vector<std::string> ready;
  for (int r = 0; r < kWorld; ++r) ready.push_back("inflight/" + std::to_string(r));
  try {
    store->wait(ready, 15s);
  } catch (const std::exception& e) {
    kill_all();
    FAIL() << "the ranks never had their ops in flight: " << e.what();
  }
  // The survivors measure from this instant (CLOCK_MONOTONIC is the same in every process).
  const int64_t hit = Clock::now().time_since_epoch().count();
  const std::string hit_text = std::to_string(hit);
  store->set("hit_at", std::vector<uint8_t>(hit_text.begin(), hit_text.end()));
  ::kill(pids[victim], freeze ? SIGSTOP : SIGKILL);
  store->set("hit", std::vector<uint8_t>{1});

  const auto deadline = Clock::now() + 20s;
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) continue;
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill_all();
        FAIL() << "rank " << r << " hung after rank " << victim << " was hit";
      }
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << " (status " << status << "): see its stderr";
  }
  ::kill(pids[victim], SIGCONT);
  ::kill(pids[victim], SIGKILL);
  int status = 0;
  ::waitpid(pids[victim], &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(Gloo, AbortedGroupIsRebuiltInProcess) { run_rebuild(2, false); }
TEST(Gloo, AbortedGroupIsRebuiltInProcessAfterRankZeroDies) { run_rebuild(0, false); }
TEST(Gloo, AbortedGroupIsRebuiltWhileTheOldOpIsBlockedOnAFrozenPeer) { run_rebuild(2, true); }

}  // namespace

namespace test_support {
namespace {

int fail(int rank, const std::string& why) {
  std::fprintf(stderr, "rebuild rank %d: %s\n", rank, why.c_str());
  return 3;
}

Clock::time_point read_time(c10d::Store& store, const std::string& key) {
  const auto v = store.get(key);
  return Clock::time_point(Clock::duration(std::stoll(std::string(v.begin(), v.end()))));
}

// Every wait of the abandoned group not yet made must fail with MembershipChanged; the first,
// already failed, rethrows its own error (MembershipChanged after a freeze, PeerLost after a
// death).
bool all_refused(std::vector<WorkPtr>& works, bool freeze) {
  for (size_t i = 0; i < works.size(); ++i) try {
      works[i]->wait();
      return false;
    } catch (const MembershipChanged&) {
      if (i == 0 && !freeze) return false;
    } catch (const PeerLost&) {
      if (i != 0) return false;
    }
  return true;
}

}  // namespace

// One rank of run_rebuild. Kill: the first pending wait fails with PeerLost within 2 s of the
// kill, undiagnosed (on_peer_error called); the rank then aborts the group itself (as the
// elastic engine does once the keeper's record arrives), and the other waits fail at once.
// Freeze: nothing fails by itself before Gloo's timeout; a watcher thread aborts the group
// when the parent says the victim is stopped. Both: the old group goes to the reaper, the
// survivors build generation 1 with 3 ranks on the same store and all-reduce rank + 1
// (expected sum: 1 + 2 + 3 + 4 minus the victim's). Freeze: that all-reduce ends while the
// reaper still holds the old group (its op blocked on the frozen peer), well before the
// timeout, and the reaper finishes after it.
int child_rebuild(int rank, int size, int port, int victim, bool freeze) {
  Options o;
  o.timeout = freeze ? 3s : 6s;
  o.abortable = true;
  std::atomic<int> reported{0};
  o.on_peer_error = [&](const PeerError& e) {
    if (e.rank == rank && e.generation == 0 && !e.timed_out) ++reported;
  };
  auto comm = join(rank, size, port, o, 0);
  Endpoint at;
  at.host = "127.0.0.1";
  at.port = port;
  auto store = connect_store(at, 20s);
  auto one = torch::ones({16});
  comm->allreduce(one)->wait();  // everybody is in the group
  const std::string me = std::to_string(rank);
  if (rank == victim) {
    store->set("inflight/" + me, std::vector<uint8_t>{1});
    std::this_thread::sleep_for(60s);  // killed or stopped by the parent meanwhile
    return 9;
  }
  std::vector<at::Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 3; ++i) {
    tensors.push_back(torch::full({kElements}, static_cast<float>(rank + 1)));
    works.push_back(comm->allreduce(tensors.back()));
  }
  store->set("inflight/" + me, std::vector<uint8_t>{1});

  Clock::time_point aborted_at;
  std::thread watcher;
  if (freeze)
    watcher = std::thread([&] {
      try {
        store->wait({"hit"}, 15s);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rebuild rank %d: no word from the parent: %s\n", rank, e.what());
      }
      aborted_at = Clock::now();
      comm->abort("freeze of rank " + std::to_string(victim));
    });
  Clock::time_point failed_at;
  try {
    works[0]->wait();
    if (watcher.joinable()) watcher.join();
    return fail(rank, "the all-reduce completed without the victim");
  } catch (const MembershipChanged& e) {
    failed_at = Clock::now();
    if (!freeze) return fail(rank, str_cat("MembershipChanged without an abort: ", e.what()));
  } catch (const PeerLost& e) {
    failed_at = Clock::now();
    if (freeze) return fail(rank, str_cat("PeerLost from a frozen peer: ", e.what()));
    if (std::string(e.what()).find("link broke") == std::string::npos)
      return fail(rank, str_cat("not the undiagnosed PeerLost: ", e.what()));
  } catch (const std::exception& e) {
    if (watcher.joinable()) watcher.join();
    return fail(rank, str_cat("wrong error: ", e.what()));
  }
  if (watcher.joinable()) watcher.join();
  const double detect =
      seconds_between(freeze ? aborted_at : read_time(*store, "hit_at"), failed_at);
  std::fprintf(stderr, "rebuild rank %d: wait failed %.3f s after the %s\n", rank, detect,
               freeze ? "abort" : "kill");
  if (detect > (freeze ? 1.0 : 2.0)) return fail(rank, "the wait failed too late");
  if (!freeze) {
    if (reported.load() != 1) return fail(rank, str_cat("on_peer_error calls: ", reported.load()));
    comm->abort("death of rank " + std::to_string(victim));
  }
  if (!all_refused(works, freeze))
    return fail(rank, "a pending wait did not throw MembershipChanged");

  Reaper& reaper = Reaper::process();
  const auto bury_at = Clock::now();
  reaper.bury(std::move(comm));
  if (seconds_between(bury_at, Clock::now()) > 0.1) return fail(rank, "bury() blocked");

  Options plain;
  plain.timeout = 6s;
  auto next = join(rank - (rank > victim ? 1 : 0), size - 1, port, plain, 1);
  auto v = torch::full({kElements}, static_cast<float>(rank + 1));
  next->allreduce(v)->wait();
  const auto done_at = Clock::now();
  const float expect = static_cast<float>(size * (size + 1) / 2 - (victim + 1));
  if (!torch::equal(v, torch::full({kElements}, expect)))
    return fail(rank, str_cat("generation 1 summed to ", v[0].item<float>(), ", not ", expect));
  const double rebuilt = seconds_between(freeze ? aborted_at : failed_at, done_at);
  std::fprintf(stderr, "rebuild rank %d: generation 1 all-reduced %.3f s later\n", rank, rebuilt);
  if (freeze) {
    if (rebuilt > 1.5) return fail(rank, "generation 1 came too late for a 3 s timeout");
    if (reaper.pending() == 0) return fail(rank, "the old group was gone before generation 1");
  }
  if (!reaper.wait_idle(freeze ? 8s : 2s)) return fail(rank, "the reaper never finished");
  std::fprintf(stderr, "rebuild rank %d: reaper done %.3f s after generation 1\n", rank,
               seconds_between(done_at, Clock::now()));
  // Leave together: a rank that exits closes its links while another may still be in an op.
  next->barrier()->wait();
  return 0;
}

}  // namespace test_support
}  // namespace krab::comm
