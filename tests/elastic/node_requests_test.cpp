// What other machines' launchers tell the keeper (elastic/node_requests.h), on real c10d
// stores: a FileStore for the requests themselves, and node 0's keeper (LocalKeeper with
// nodes > 1) on a TCPStore on loopback, as `krab train --nnodes 2` runs it, with a clock the
// test controls.
#include "elastic/node_requests.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "core/errors.h"
#include "elastic/local_keeper.h"
#include "elastic/membership_view.h"

namespace krab::elastic {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

Instant at(int64_t ms) { return {ms, 1765000000000 + ms}; }

struct FileJob {
  fs::path dir;
  std::unique_ptr<comm::StoreServer> server;
  FileJob() {
    std::string templ = (fs::temp_directory_path() / "krab-requests-XXXXXX").string();
    KRAB_CHECK(::mkdtemp(templ.data()) != nullptr, "mkdtemp");
    dir = templ;
    server = std::make_unique<comm::StoreServer>(
        comm::Endpoint{"127.0.0.1", 0, (dir / "store").string(), kSecret});
  }
  ~FileJob() {
    server.reset();
    fs::remove_all(dir);
  }
  c10d::Store& store() { return *server->store(); }
  void put(const std::string& key, const std::string& value) {
    store().set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
};

TEST(NodeRequests, ExitsRoundTripAndAMalformedReportIsNotAnExit) {
  FileJob job;
  EXPECT_FALSE(read_exit(job.store(), {1, 0, 0}).has_value());
  report_exit(job.store(), {1, 0, 0}, 0, 9);
  report_exit(job.store(), {1, 1, 2}, 3, 0);
  ASSERT_TRUE(read_exit(job.store(), {1, 0, 0}).has_value());
  EXPECT_EQ(read_exit(job.store(), {1, 0, 0})->signal, 9);
  EXPECT_EQ(read_exit(job.store(), {1, 1, 2})->code, 3);
  for (const char* bad : {"9", "1 2 3", "x 1", "1  2", "99999999999 0"}) {
    job.put("elastic/exit/2.0.0", bad);
    EXPECT_FALSE(read_exit(job.store(), {2, 0, 0}).has_value()) << bad;
  }
}

TEST(NodeRequests, AnnouncementsAreReadOnceInOrderAndAMalformedOneIsSkipped) {
  FileJob job;
  int64_t cursor = 0;
  EXPECT_TRUE(read_announcements(job.store(), &cursor).empty());
  announce_joiner(job.store(), {{1, 0, 1}, 0});
  job.store().add("elastic/announce/next", 1);  // a launcher that wrote garbage at entry 1
  job.put("elastic/announce/1", "not-a-member 0");
  announce_joiner(job.store(), {{2, 3, 0}, 3});
  const auto got = read_announcements(job.store(), &cursor);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].member, (MemberId{1, 0, 1}));
  EXPECT_EQ(got[1].member, (MemberId{2, 3, 0}));
  EXPECT_EQ(got[1].local_rank, 3);
  EXPECT_EQ(cursor, 3);
  EXPECT_TRUE(read_announcements(job.store(), &cursor).empty());
}

TEST(NodeRequests, AdmissionIsAnsweredWithANodeOrTheRefusalsWords) {
  FileJob job;
  EXPECT_THROW(ask_admission(job.store(), "fp", 200ms), Timeout);  // nobody answers
  int64_t cursor = 0;
  auto pending = read_admissions(job.store(), &cursor);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].fingerprint, "fp");
  answer_admission(job.store(), pending[0].index, 2, "");
  // The answer to entry 0 came late; the next request is entry 1.
  std::thread keeper([&] {
    while (read_admissions(job.store(), &cursor).empty()) std::this_thread::sleep_for(5ms);
    answer_admission(job.store(), 1, -1, "node 3's job differs from node 0's at key x: 'a' vs 'b'");
  });
  try {
    ask_admission(job.store(), "other", 5s);
    ADD_FAILURE() << "a refused machine was admitted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "node 3's job differs from node 0's at key x: 'a' vs 'b'");
  }
  keeper.join();
  job.put("elastic/admit/2/answer", "node -4");  // not an answer a keeper writes
  EXPECT_THROW(ask_admission(job.store(), "fp", 1s), CorruptData);
  job.put("elastic/admit/3/answer", "node 4");
  EXPECT_EQ(ask_admission(job.store(), "fp", 1s), 4);
}

// Node 0's keeper of two machines: generation 0 lists node 1's workers; the records name the
// TCPStore; node 1's report of an exit makes the next generation; an announced joiner is
// expected and admitted once it asks; machines asking to join get consecutive node numbers
// or the admit callback's words.
TEST(LocalKeeperAcrossMachines, ReadsReportsAnnouncementsAndAdmissionsFromTheTcpStore) {
  comm::StoreServer server("127.0.0.1", 0, 5s, kSecret);
  LocalKeeperOptions o;
  o.keeper.heartbeat_ms = 200;
  o.keeper.dead_after_ms = 3000;
  o.keeper.max_workers = 4;
  o.control = {"127.0.0.1", server.port(), "", kSecret};
  o.start_grace = 60s;
  o.nodes = 2;
  o.admit = [](const std::string& fingerprint, int node) {
    return fingerprint == "same" ? "" : str_cat("node ", node, " differs");
  };
  std::vector<Member> members;
  for (int node = 0; node < 2; ++node)
    for (int slot = 0; slot < 2; ++slot)
      members.push_back({0, node, slot, node == 0 ? 100 + slot : 0, {node, slot, 0}});
  LocalKeeper keeper(o, members, at(0));
  auto node1 = comm::connect_store(o.control, 5s);  // node 1's launcher
  const GenerationRecord g0 = read_record(*node1, 0);
  EXPECT_EQ(g0.store, o.control.to_string());
  EXPECT_EQ(g0.workers(), 4);

  report_exit(*node1, {1, 1, 0}, 0, 9);
  auto r = keeper.poll(at(100));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->store, o.control.to_string());
  ASSERT_EQ(r->lost.size(), 1u);
  EXPECT_EQ(r->lost[0], (LostMember{{1, 1, 0}, "killed by signal 9"}));
  EXPECT_FALSE(keeper.poll(at(200)).has_value()) << "one exit made two records";

  announce_joiner(*node1, {{1, 1, 1}, 1});
  EXPECT_FALSE(keeper.poll(at(300)).has_value()) << "admitted before it asked";
  request_join(*node1, {1, 1, 1}, 4242);
  r = keeper.poll(at(400));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->workers(), 4);
  EXPECT_EQ(r->members.back().id, (MemberId{1, 1, 1}));

  std::atomic<bool> done{false};
  std::thread asker([&] {
    try {
      ask_admission(*comm::connect_store(o.control, 5s), "different", 5s);
      ADD_FAILURE() << "a machine whose job differs was admitted";
    } catch (const InvalidArgument& e) {
      EXPECT_STREQ(e.what(), "node 2 differs");
    }
    EXPECT_EQ(ask_admission(*comm::connect_store(o.control, 5s), "same", 5s), 2);
    EXPECT_EQ(ask_admission(*comm::connect_store(o.control, 5s), "same", 5s), 3);
    done = true;
  });
  // The keeper's clock stands still: nobody is timed out while the machines ask.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    keeper.poll(at(500));
    std::this_thread::sleep_for(10ms);
  }
  asker.join();
}

}  // namespace
}  // namespace krab::elastic
