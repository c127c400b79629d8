// Gloo backend tests. Tier 1: ranks as threads in one process over a loopback TCPStore (fast,
// TSan-able). Tier 2: ranks as processes (this binary re-executed with --child), for a peer
// that really dies.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "comm/factory.h"
#include "comm/store.h"
#include "core/errors.h"
#include "gloo_support.h"
#ifdef KRAB_HAVE_SUITE
#include "collective_suite.h"
#endif

namespace krab::comm {
namespace {

using namespace std::chrono_literals;
using test_support::join;
using test_support::run_ranks;
using test_support::self_exe;
using test_support::spawn_child;

#ifdef KRAB_HAVE_SUITE
class GlooSuite : public ::testing::TestWithParam<int> {};
TEST_P(GlooSuite, CollectiveSuite) {
  run_ranks(GetParam(), [](int, Communicator& c) { krab::testing::run_collective_suite(c); });
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooSuite, ::testing::Values(1, 2, 3, 4));
#endif

// The formulas themselves, without a network: closed forms, rounding and groups of one.
TEST(WireBytes, ClosedForms) {
  EXPECT_EQ(wire_bytes(OpKind::kAllreduce, 4000, 4), 6000u);    // 2 (W-1)/W N
  EXPECT_EQ(wire_bytes(OpKind::kAllreduce, 10, 3), 13u);        // 40/3, rounded down
  EXPECT_EQ(wire_bytes(OpKind::kAllgather, 100, 4), 300u);      // (W-1) n
  EXPECT_EQ(wire_bytes(OpKind::kReduceScatter, 400, 4), 300u);  // (W-1)/W N
  EXPECT_EQ(wire_bytes(OpKind::kAlltoall, 300, 3), 200u);       // (W-1)/W N
  EXPECT_EQ(wire_bytes(OpKind::kBroadcast, 100, 5), 400u);      // (W-1) N at the root
  EXPECT_EQ(wire_bytes(OpKind::kSend, 123, 2), 123u);
  EXPECT_EQ(wire_bytes(OpKind::kRecv, 123, 2), 0u);
  EXPECT_EQ(wire_bytes(OpKind::kBarrier, 0, 8), 0u);
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    const auto op = static_cast<OpKind>(k);
    EXPECT_EQ(wire_bytes(op, 1000, 1), op == OpKind::kSend ? 1000u : 0u) << op_name(op);
    EXPECT_EQ(wire_bytes(op, 0, 4), 0u) << op_name(op);
  }
  EXPECT_THROW(wire_bytes(OpKind::kAllreduce, 8, 0), InvalidArgument);
}

TEST(Gloo, AllreduceMatchesClosedForm) {
  run_ranks(3, [](int r, Communicator& c) {
    auto t = torch::full({1000}, static_cast<float>(r + 1));
    c.allreduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::allclose(t, torch::full({1000}, 6.0f)));
    auto a = torch::full({5}, static_cast<double>(r), torch::kFloat64);
    c.allreduce(a, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(torch::allclose(a, torch::full({5}, 1.0, torch::kFloat64)));
  });
}

TEST(Gloo, TrafficMeterFollowsRingModel) {
  const int W = 4;
  run_ranks(W, [](int, Communicator& c) {
    auto t = torch::ones({1 << 16});
    c.allreduce(t)->wait();
    const uint64_t n = t.nbytes();
    EXPECT_EQ(c.traffic().bytes_sent[static_cast<int>(OpKind::kAllreduce)], 2 * (W - 1) * n / W);
  });
}

TEST(Gloo, TimeoutNamesOpSequenceAndAbsentRank) {
  std::atomic<int> timeouts{0};
  run_ranks(
      3,
      [&](int r, Communicator& c) {
        auto t = torch::ones({16});
        c.allreduce(t)->wait();  // #0: everybody
        if (r == 2) {
          std::this_thread::sleep_for(2500ms);  // never joins #1 in time
          return;
        }
        try {
          c.allreduce(t)->wait();  // #1
          ADD_FAILURE() << "allreduce #1 should have timed out on rank " << r;
        } catch (const Timeout& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("allreduce #1"), std::string::npos) << m;
          EXPECT_NE(m.find("rank 2 never joined"), std::string::npos) << m;
          ++timeouts;
        }
      },
      1000ms);
  EXPECT_EQ(timeouts.load(), 2);
}

TEST(Gloo, DebugChecksReportShapeMismatch) {
  std::atomic<int> mismatches{0};
  run_ranks(
      2,
      [&](int r, Communicator& c) {
        auto t = torch::ones({r == 0 ? 8 : 9});
        try {
          c.allreduce(t)->wait();
        } catch (const Error& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("collective mismatch at #0"), std::string::npos) << m;
          ++mismatches;
        }
      },
      3000ms, /*debug=*/true);
  EXPECT_EQ(mismatches.load(), 2);
}

TEST(Gloo, SplitFormsIndependentGroups) {
  run_ranks(4, [](int r, Communicator& c) {
    auto sub = c.split(r % 2, r);
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), r / 2);
    auto t = torch::full({3}, static_cast<float>(r));
    sub->allreduce(t)->wait();
    const float expect = (r % 2 == 0) ? 0 + 2 : 1 + 3;
    EXPECT_TRUE(torch::allclose(t, torch::full({3}, expect)));
  });
}

// ---- processes: a peer that dies ----

TEST(Gloo, DeadPeerIsNamedByTheSurvivors) {
  StoreServer server("127.0.0.1", 0, 20s);
  const int W = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < W; ++r)
    pids.push_back(spawn_child({self_exe(), "--child-deadpeer", std::to_string(r),
                                std::to_string(W), std::to_string(server.port())}));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (int r = 0; r < W; ++r) {
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        FAIL() << "rank " << r << " hung after its peer died";
      }
      std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(WIFEXITED(status));
    // rank 2 exits 9 on purpose; the survivors exit 0 only if they saw PeerLost naming rank 2.
    EXPECT_EQ(WEXITSTATUS(status), r == 2 ? 9 : 0) << "rank " << r;
  }
}

}  // namespace

namespace test_support {

int child_deadpeer(int rank, int size, int port) {
  auto comm = join(rank, size, port, 10s);
  auto t = torch::ones({1024});
  comm->allreduce(t)->wait();
  if (rank == 2) ::_exit(9);
  std::string message;
  try {
    for (int i = 0; i < 100; ++i) comm->allreduce(t)->wait();
    return 5;
  } catch (const PeerLost& e) {
    message = e.what();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: wrong error: %s\n", rank, e.what());
    return 4;
  }
  // A survivor that exits at once stops its own heartbeat, and the other survivor, still
  // diagnosing, would rightly call it gone too. Both wait here until both have diagnosed, so
  // the only rank that really stopped is rank 2.
  Endpoint at;
  at.host = "127.0.0.1";
  at.port = port;
  auto store = connect_store(at, 20s);
  store->set("deadpeer/diagnosed/" + std::to_string(rank), std::vector<uint8_t>{1});
  store->wait({"deadpeer/diagnosed/0", "deadpeer/diagnosed/1"});
  if (message.find(" failed: rank 2 stopped responding") != std::string::npos) return 0;
  std::fprintf(stderr, "rank %d: PeerLost must name rank 2 alone: %s\n", rank, message.c_str());
  return 3;
}

}  // namespace test_support
}  // namespace krab::comm

int main(int argc, char** argv) {
  using namespace krab::comm::test_support;
  if (argc == 5 && std::string(argv[1]) == "--child-deadpeer")
    return child_deadpeer(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc == 7 && std::string(argv[1]) == "--child-rebuild")
    return child_rebuild(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                         std::atoi(argv[5]), std::string(argv[6]) == "freeze");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
