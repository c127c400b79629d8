// The entry gate of a generation (elastic/entry_gate.h) on a real c10d FileStore, each member
// a thread with a client of its own, as processes of one node have: every member builds the
// group or none does, whatever order they arrive in and whatever each one's view says.
#include "elastic/entry_gate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"

namespace krab::elastic {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct GateStore {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("krab-gate-" + std::to_string(::getpid()) + "-" +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::unique_ptr<comm::StoreServer> server;
  GateStore() {
    std::filesystem::remove(path);
    server = std::make_unique<comm::StoreServer>(endpoint());
  }
  ~GateStore() {
    server.reset();
    std::filesystem::remove(path);
  }
  comm::Endpoint endpoint() const { return {"", 0, path.string(), ""}; }
  // A member's own client, under generation 1's prefix (as ElasticEngine::connect opens it).
  comm::StorePtr client() const {
    return comm::prefixed("g1/", comm::connect_store(endpoint(), 5s));
  }
};

// What one member's pass through the gate ended in, and how long it took.
struct Pass {
  std::string verdict;  // "build", "abandon", or "timeout: <message>"
  Clock::duration took{};
};

Pass pass(const GateStore& gs, int rank, int size, const std::function<bool()>& superseded,
          std::chrono::milliseconds timeout) {
  const comm::StorePtr store = gs.client();
  const auto t0 = Clock::now();
  Pass out;
  try {
    pass_entry_gate(*store, rank, size, 1, superseded, timeout);
    out.verdict = "build";
  } catch (const MembershipChanged&) {
    out.verdict = "abandon";
  } catch (const Timeout& e) {
    out.verdict = std::string("timeout: ") + e.what();
  }
  out.took = Clock::now() - t0;
  return out;
}

const auto kNever = [] { return false; };

TEST(EntryGate, EveryMemberBuildsWhenAllArrive) {
  GateStore gs;
  std::vector<Pass> passes(3);
  std::vector<std::thread> members;
  for (int r = 0; r < 3; ++r)
    members.emplace_back([&, r] { passes[r] = pass(gs, r, 3, kNever, 5s); });
  for (auto& t : members) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(passes[r].verdict, "build") << "rank " << r;
}

// Rank 2 never comes (it skipped to the newer record); once the two others' views have read a
// newer generation they give this one up at once, far within the timeout. Rank 2 arriving after
// that verdict gives it up too, although everyone has now arrived and its view says nothing.
TEST(EntryGate, ASupersededGenerationIsGivenUpByEveryMemberEvenALateOne) {
  GateStore gs;
  std::atomic<bool> newer{false};
  std::vector<Pass> passes(3);
  std::vector<std::thread> members;
  for (int r = 0; r < 2; ++r)
    members.emplace_back([&, r] {
      passes[r] = pass(
          gs, r, 3, [&] { return newer.load(); }, 20s);
    });
  std::this_thread::sleep_for(50ms);  // both wait at the gate for rank 2
  newer = true;
  for (auto& t : members) t.join();
  passes[2] = pass(gs, 2, 3, kNever, 20s);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(passes[r].verdict, "abandon");
    EXPECT_LT(passes[r].took, 2s);
  }
}

// Arrival wins: a member whose view already read a newer record still builds when everyone is
// there, because the others (whose views have not read it yet) may already be building.
TEST(EntryGate, AMemberThatSeesANewerRecordBuildsWhenEveryoneArrived) {
  GateStore gs;
  std::vector<Pass> passes(3);
  std::vector<std::thread> members;
  for (int r = 0; r < 2; ++r)
    members.emplace_back([&, r] { passes[r] = pass(gs, r, 3, kNever, 20s); });
  std::this_thread::sleep_for(50ms);
  passes[2] = pass(
      gs, 2, 3, [] { return true; }, 20s);
  for (auto& t : members) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(passes[r].verdict, "build") << "rank " << r;
}

// Nobody newer, and rank 1 of 2 never comes: the gate times out naming it, and leaves the
// verdict "abandon", so rank 1 arriving afterwards does not wait for a rank 0 that has left.
TEST(EntryGate, ATimeoutNamesTheMissingAndAbandons) {
  GateStore gs;
  const Pass first = pass(gs, 0, 2, kNever, 200ms);
  EXPECT_EQ(first.verdict.rfind("timeout: ", 0), 0u) << first.verdict;
  EXPECT_NE(first.verdict.find("rank 1 did not arrive"), std::string::npos) << first.verdict;
  EXPECT_NE(first.verdict.find("generation 1"), std::string::npos) << first.verdict;
  const Pass late = pass(gs, 1, 2, kNever, 20s);
  EXPECT_EQ(late.verdict, "abandon");
  EXPECT_LT(late.took, 2s);
}

}  // namespace
}  // namespace krab::elastic
