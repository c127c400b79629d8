// The c10d::Store over etcd (elastic/etcd_store.h) against a real single-member etcd: TCPStore's
// semantics key by key, add() under contention, fencing of a deposed leader, and the membership
// records (elastic/membership_view.h) written and read through it as the keeper and the agents
// will. Skipped when there is no etcd binary. A few seconds.
#include "elastic/etcd_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/errors.h"
#include "elastic/etcd_client.h"
#include "elastic/generation.h"
#include "elastic/membership_view.h"
#include "elastic/support/etcd_daemon.h"

namespace krab::elastic {
namespace {

using std::chrono::milliseconds;

std::vector<uint8_t> b(const std::string& s) { return {s.begin(), s.end()}; }
std::string s(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

class EtcdStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { etcd_ = test::EtcdDaemon::start(1, &skip_).release(); }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override {
    if (etcd_ == nullptr) GTEST_SKIP() << skip_;
    prefix_ =
        std::string("/t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }
  // A client of its own (another agent, as on another machine).
  std::shared_ptr<EtcdClient> client() {
    EtcdClient::Options o;
    o.endpoints = EtcdClient::parse_endpoints(etcd_->endpoints(), "--rdzv-endpoints");
    o.timeout = milliseconds(5000);
    return std::make_shared<EtcdClient>(o);
  }
  c10::intrusive_ptr<EtcdStore> store(milliseconds timeout = milliseconds(2000)) {
    return c10::make_intrusive<EtcdStore>(client(), prefix_, timeout);
  }

  static test::EtcdDaemon* etcd_;
  static std::string skip_;
  std::string prefix_;
};
test::EtcdDaemon* EtcdStoreTest::etcd_ = nullptr;
std::string EtcdStoreTest::skip_;

TEST_F(EtcdStoreTest, KeysBehaveAsInATcpStoreUnderTheirPrefix) {
  auto a = store(),
       other = c10::make_intrusive<EtcdStore>(client(), prefix_ + "x/", milliseconds(300));
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += char(i);
  a->set("k", b(bytes));
  EXPECT_EQ(s(a->get("k")), bytes);
  EXPECT_TRUE(a->check({"k"}));
  EXPECT_FALSE(a->check({"k", "absent"}));
  EXPECT_FALSE(other->check({"k"})) << "another prefix sees this one's keys";
  EXPECT_THROW(other->get("k"), Timeout);
  EXPECT_EQ(a->getNumKeys(), 1);
  // compareSet: absent and "" -> written; a wrong expectation leaves the value and returns it;
  // absent with an expectation returns the expectation (TCPStore's answer).
  EXPECT_EQ(s(a->compareSet("c", {}, b("one"))), "one");
  EXPECT_EQ(s(a->compareSet("c", b("zero"), b("two"))), "one");
  EXPECT_EQ(s(a->compareSet("c", b("one"), b("two"))), "two");
  EXPECT_EQ(s(a->compareSet("absent", b("x"), b("y"))), "x");
  EXPECT_FALSE(a->check({"absent"}));
  EXPECT_TRUE(a->deleteKey("c"));
  EXPECT_FALSE(a->deleteKey("c"));
  // get() waits for a key another agent writes.
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(200));
    store()->set("late", b("here"));
  });
  EXPECT_EQ(s(a->get("late")), "here");
  writer.join();
}

TEST_F(EtcdStoreTest, AddCountsEveryIncrementOfConcurrentAgents) {
  std::vector<std::thread> agents;
  for (int t = 0; t < 3; ++t)
    agents.emplace_back([&] {
      auto mine = store();
      for (int i = 0; i < 20; ++i) mine->add("n", 1);
    });
  for (auto& t : agents) t.join();
  auto a = store();
  EXPECT_EQ(a->add("n", 0), 60);
  EXPECT_EQ(s(a->get("n")), "60");  // decimal text, as TCPStore keeps a counter
  a->set("bad", b("x1"));
  EXPECT_THROW(a->add("bad", 1), CorruptData);
}

// A fenced writer writes only while the leader key names it; once another agent leads, every
// kind of write throws PeerLost and changes nothing.
TEST_F(EtcdStoreTest, ADeposedLeaderWritesNothing) {
  auto etcd = client();
  etcd->put(prefix_ + "leader", "agent-a");
  auto a = c10::make_intrusive<EtcdStore>(etcd, prefix_ + "data/", milliseconds(500));
  a->fence(prefix_ + "leader", "agent-a");
  a->set("k", b("1"));
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(s(a->compareSet("c", {}, b("x"))), "x");
  etcd->put(prefix_ + "leader", "agent-b");
  EXPECT_THROW(a->set("k", b("2")), PeerLost);
  EXPECT_THROW(a->add("n", 1), PeerLost);
  EXPECT_THROW(a->compareSet("c", b("x"), b("y")), PeerLost);
  EXPECT_THROW(a->deleteKey("k"), PeerLost);
  auto reader = c10::make_intrusive<EtcdStore>(client(), prefix_ + "data/", milliseconds(500));
  EXPECT_EQ(s(reader->get("k")), "1");
  EXPECT_EQ(s(reader->get("n")), "2");
  EXPECT_EQ(s(reader->get("c")), "x");
}

// The records of a membership published by one agent and read by another through etcd, as the
// leader's keeper and the other machines' agents exchange them.
TEST_F(EtcdStoreTest, GenerationRecordsTravelThroughIt) {
  auto leader = store(), agent = store();
  EXPECT_EQ(current_generation(*agent), -1);
  GenerationRecord g;
  g.generation = 0;
  g.members = {{0, 0, 0, 11, {0, 0, 0}}, {1, 1, 0, 0, {1, 0, 0}}};
  g.store = "10.0.0.1:29500";
  g.reason = "start";
  publish_record(*leader, g);
  EXPECT_EQ(current_generation(*agent), 0);
  EXPECT_EQ(read_record(*agent, 0), g);
  publish_record(*leader, g);  // publishing the same bytes again is harmless
  GenerationRecord other = g;
  other.reason = "tampered";
  EXPECT_THROW(publish_record(*leader, other), InvalidArgument);
}

}  // namespace
}  // namespace krab::elastic
