// Generation records in the store and a worker's view of them (elastic/membership_view.h), on
// a real c10d FileStore in a temporary file, as the launcher hosts it on one node; the view
// through a store that stops answering for a while, and comm::reconnecting_store against a
// loopback TCPStore that restarts; and the commit vote (elastic/commit_vote.h) on thread-ranks
// joined by loopback Gloo.
#include "elastic/membership_view.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "core/errors.h"
#include "elastic/commit_vote.h"
#include "support/gloo_ranks.h"

namespace krab::elastic {
namespace {

using namespace std::chrono_literals;

// A FileStore in a file of its own, hosted as the launcher hosts it, removed at the end.
struct FileStore {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("krab-view-" + std::to_string(::getpid()) + "-" +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::unique_ptr<comm::StoreServer> server;
  comm::StorePtr store;
  FileStore() {
    std::filesystem::remove(path);
    server = std::make_unique<comm::StoreServer>(comm::Endpoint{"", 0, path.string(), ""});
    store = comm::connect_store(comm::Endpoint{"", 0, path.string(), ""}, 5s);
  }
  ~FileStore() {
    store.reset();
    server.reset();
    std::filesystem::remove(path);
  }
};

GenerationRecord record(int64_t g, RecordKind kind, int workers) {
  GenerationRecord r;
  r.generation = g;
  r.decided_step = 10 + g;
  for (int i = 0; i < workers; ++i) r.members.push_back({i, 0, i, 1000 + i, {0, i, 0}});
  r.store = "file /run/g" + std::to_string(g);
  r.kind = kind;
  r.reason = kind == RecordKind::kAbort ? "death" : "join";
  r.decided_at_ms = 1765000000000 + g;
  return r;
}

TEST(Records, PublishedOnceReadBackAndNeverRewritten) {
  FileStore fs;
  EXPECT_EQ(current_generation(*fs.store), -1);
  publish_record(*fs.store, record(0, RecordKind::kProposal, 4));
  publish_record(*fs.store, record(1, RecordKind::kAbort, 3));
  EXPECT_EQ(current_generation(*fs.store), 1);
  EXPECT_EQ(encode(read_record(*fs.store, 1)), encode(record(1, RecordKind::kAbort, 3)));
  // The same bytes again (a keeper publishing twice) are harmless; other bytes are refused and
  // leave the record as it was.
  publish_record(*fs.store, record(1, RecordKind::kAbort, 3));
  try {
    publish_record(*fs.store, record(1, RecordKind::kAbort, 2));
    FAIL() << "a rewrite was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("generation 1 is already recorded"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_record(*fs.store, 1).workers(), 3);
  // Publishing an older generation late never moves current back.
  publish_record(*fs.store, record(3, RecordKind::kAbort, 2));
  publish_record(*fs.store, record(2, RecordKind::kAbort, 3));
  EXPECT_EQ(current_generation(*fs.store), 3);
}

// The view sees an abort within a few polling periods and calls on_abort once; proposals are
// remembered without a call; records are read in order, every one of them.
TEST(MembershipView, AnAbortReachesTheWorkerAtOnceAndAProposalWaitsForTheVote) {
  FileStore fs;
  publish_record(*fs.store, record(0, RecordKind::kProposal, 4));
  std::atomic<int> aborts{0};
  std::atomic<int64_t> aborted_generation{-1};
  MembershipView view(fs.store, 0, 10ms, [&](const GenerationRecord& r) {
    ++aborts;
    aborted_generation = r.generation;
  });
  EXPECT_EQ(view.newest(), 0);
  publish_record(*fs.store, record(1, RecordKind::kProposal, 5));
  EXPECT_EQ(view.wait_for(1, 5s).workers(), 5);
  EXPECT_EQ(aborts.load(), 0);
  EXPECT_EQ(view.newest(), 1);

  const auto t0 = std::chrono::steady_clock::now();
  publish_record(*fs.store, record(2, RecordKind::kAbort, 4));
  publish_record(*fs.store, record(3, RecordKind::kProposal, 5));
  EXPECT_EQ(view.wait_for(3, 5s).generation, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(aborted_generation.load(), 2);
  EXPECT_EQ(view.wait_for(2, 1s).reason, "death");
  EXPECT_THROW(view.wait_for(9, 50ms), Timeout);
}

// A record another process of the node scribbled over is refused naming its key; the view
// stops and says so to whoever waits.
TEST(MembershipView, ACorruptRecordStopsTheViewByName) {
  FileStore fs;
  MembershipView view(fs.store, 0, 10ms, [](const GenerationRecord&) {});
  const std::string bad = "generation 1\nworkers two\n";
  fs.store->set(record_key(1), std::vector<uint8_t>(bad.begin(), bad.end()));
  fs.store->set(kCurrentKey, std::vector<uint8_t>{'1'});
  try {
    view.wait_for(1, 5s);
    FAIL() << "a corrupt record was accepted";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("elastic/gen/1"), std::string::npos) << e.what();
  }
}

// The node store as a machine cut off from node 0 sees it (§6.4): while `down`, every call
// fails as c10d's TCPStore client fails one whose answer does not come.
class CutStore : public c10d::Store {
 public:
  explicit CutStore(comm::StorePtr base) : base_(std::move(base)) {}
  std::atomic<bool> down{false};

  void set(const std::string& k, const std::vector<uint8_t>& v) override { live().set(k, v); }
  std::vector<uint8_t> get(const std::string& k) override { return live().get(k); }
  int64_t add(const std::string& k, int64_t v) override { return live().add(k, v); }
  bool deleteKey(const std::string& k) override { return live().deleteKey(k); }
  bool check(const std::vector<std::string>& k) override { return live().check(k); }
  int64_t getNumKeys() override { return live().getNumKeys(); }
  void wait(const std::vector<std::string>& k) override { live().wait(k); }
  void wait(const std::vector<std::string>& k, const std::chrono::milliseconds& t) override {
    live().wait(k, t);
  }

 private:
  c10d::Store& live() {
    if (down) throw std::runtime_error("Socket Timeout");
    return *base_;
  }
  comm::StorePtr base_;
};

// A store that stops answering does not stop the view: the keeper decides meanwhile, and the
// view reads the record once the store answers again (a worker cut off by a partition learns
// it was dropped when the link returns). Until then wait_for times out naming the store's error.
TEST(MembershipView, AStoreThatStopsAnsweringIsReadAgainOnceItAnswers) {
  FileStore fs;
  publish_record(*fs.store, record(0, RecordKind::kProposal, 3));
  auto cut = c10::make_intrusive<CutStore>(fs.store);
  std::atomic<int> aborts{0};
  MembershipView view(cut, 0, 10ms, [&](const GenerationRecord&) { ++aborts; });
  cut->down = true;
  publish_record(*fs.store, record(1, RecordKind::kAbort, 2));  // the keeper, beyond the cut
  try {
    view.wait_for(1, 300ms);
    FAIL() << "a record was read through a store that does not answer";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("the store's last error: Socket Timeout"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(aborts.load(), 0);
  cut->down = false;
  EXPECT_EQ(view.wait_for(1, 5s).workers(), 2);
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(view.newest(), 1);
}

// comm::reconnecting_store (the control store of an elastic worker and of a machine's agent):
// a call that fails drops the connection, and the next call connects again. Here the store's
// server goes away and comes back on the same port; a client that kept its first connection
// would never reach the new one.
TEST(ReconnectingStore, TheCallAfterAFailedOneConnectsAgain) {
  ::signal(SIGPIPE, SIG_IGN);  // a write to the closed connection must fail, not end the test
  auto server = std::make_unique<comm::StoreServer>("127.0.0.1", 0, 5s);
  const int port = server->port();
  comm::StorePtr client = comm::reconnecting_store(comm::Endpoint{"127.0.0.1", port}, 2s);
  client->set("before", std::vector<uint8_t>{1});
  EXPECT_TRUE(client->check({"before"}));
  server.reset();
  EXPECT_ANY_THROW(client->check({"before"}));
  server = std::make_unique<comm::StoreServer>("127.0.0.1", port, 5s);
  EXPECT_FALSE(client->check({"before"}));  // the new server's (empty) store answers
  client->set("after", std::vector<uint8_t>{2});
  EXPECT_EQ(server->store()->get("after"), std::vector<uint8_t>{2});
}

// Every rank learns every rank's values from one all-reduce, and the same on each.
TEST(CommitVote, EveryRankLearnsTheNewestGenerationAndEveryComputeTime) {
  std::vector<VoteResult> results(3);
  krab::testing::run_gloo_ranks(3, [&](int rank, comm::Communicator& group) {
    results[rank] = commit_vote(group, Vote{rank == 1 ? 7 : 6, 100 * (rank + 1)});
  });
  for (const auto& r : results) {
    EXPECT_EQ(r.newest_generation, 7);
    EXPECT_EQ(r.compute_us, (std::vector<int64_t>{100, 200, 300}));
  }
}

TEST(CommitVote, ASumThatIsNotTheWorldIsAnInternalError) {
  std::vector<int64_t> summed = vote_slots(0, 2, {3, 5});
  EXPECT_EQ(summed, (std::vector<int64_t>{1, 3, 0, 5, 0}));
  EXPECT_THROW(read_vote(summed, 2), Error);  // only one rank's contribution
  summed[0] = 2;
  EXPECT_EQ(read_vote(summed, 2).newest_generation, 3);
}

}  // namespace
}  // namespace krab::elastic
