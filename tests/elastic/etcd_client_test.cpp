// The etcd client, election and fencing against a real etcd (docs/design/elastic.md §6.2):
// one private single-member etcd for the suite (each case under its own key prefix), a
// three-member cluster for the member-loss case, and closed ports for the unreachable cases.
// Skipped when there is no etcd binary. Lease cases wait out real TTLs (2 s, etcd's minimum):
// the suite takes ~20 s.
#include "elastic/etcd_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/errors.h"
#include "elastic/etcd_election.h"
#include "elastic/support/etcd_daemon.h"

namespace krab::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

EtcdClient::Options options_for(const std::string& endpoints, milliseconds timeout) {
  EtcdClient::Options o;
  o.endpoints = EtcdClient::parse_endpoints(endpoints, "--rdzv-endpoints");
  o.timeout = timeout;
  return o;
}

std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i) s += char(i);
  return s;
}

TEST(EtcdEndpoints, ParsesTheListAndNamesABadItem) {
  EXPECT_EQ(EtcdClient::parse_endpoints("10.0.0.1:2379,h:1,[::1]:65535", "--rdzv-endpoints"),
            (std::vector<std::string>{"10.0.0.1:2379", "h:1", "[::1]:65535"}));
  for (const char* bad : {"", "h:2379,", "h", ":2379", "h:0", "h:65536", "h:23x9", "h:"}) {
    try {
      EtcdClient::parse_endpoints(bad, "--rdzv-endpoints");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--rdzv-endpoints"), std::string::npos) << e.what();
    }
  }
}

// A refused endpoint is retried until the call's timeout, then the call throws Timeout naming
// every endpoint and the bound — not before the bound, and not much after it.
TEST(EtcdUnreachable, TimesOutWithinTheBoundNamingEachEndpoint) {
  const std::string a = "127.0.0.1:" + std::to_string(test::closed_port());
  const std::string b = "127.0.0.1:" + std::to_string(test::closed_port());
  EtcdClient client(options_for(a + "," + b, milliseconds(1000)));
  const auto t0 = Clock::now();
  try {
    client.put("k", "v");
    FAIL() << "put to closed ports succeeded";
  } catch (const Timeout& e) {
    const double took = seconds_since(t0);
    EXPECT_GE(took, 0.99);
    EXPECT_LT(took, 1.5);
    const std::string what = e.what();
    EXPECT_NE(what.find(a), std::string::npos) << what;
    EXPECT_NE(what.find(b), std::string::npos) << what;
    EXPECT_NE(what.find("within 1 s"), std::string::npos) << what;
    std::printf("unreachable: Timeout after %.3f s: %s\n", took, what.c_str());
  }
}

// The launcher's start-time check: exit 2 (InvalidArgument) naming the flag, the list, the
// bound and its key, within the bound.
TEST(EtcdUnreachable, RequireEtcdRefusesAListWhereNothingAnswers) {
  const std::string list = "127.0.0.1:" + std::to_string(test::closed_port()) +
                           ",127.0.0.1:" + std::to_string(test::closed_port());
  const auto t0 = Clock::now();
  try {
    require_etcd("--rdzv-endpoints", list, milliseconds(500), "comm.timeout_s");
    FAIL() << "require_etcd accepted closed ports";
  } catch (const InvalidArgument& e) {
    EXPECT_LT(seconds_since(t0), 1.0);
    EXPECT_EQ(e.exit_code(), 2);
    const std::string what = e.what();
    EXPECT_EQ(
        what.rfind("--rdzv-endpoints " + list + ": no etcd answered within 0.5 s (comm.timeout_s)",
                   0),
        0u)
        << what;
    std::printf("require_etcd: %s\n", what.c_str());
  }
  EXPECT_THROW(require_etcd("--rdzv-endpoints", "127.0.0.1", milliseconds(500), "comm.timeout_s"),
               InvalidArgument);
}

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { etcd_ = test::EtcdDaemon::start(1, &skip_).release(); }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override {
    if (etcd_ == nullptr) GTEST_SKIP() << skip_;
    client_ = std::make_unique<EtcdClient>(options_for(etcd_->endpoints(), milliseconds(5000)));
    prefix_ =
        std::string("/t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }
  // A second agent: its own client (its own connection), as on another machine.
  std::unique_ptr<EtcdClient> other_client() {
    return std::make_unique<EtcdClient>(options_for(etcd_->endpoints(), milliseconds(5000)));
  }

  static test::EtcdDaemon* etcd_;
  static std::string skip_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};
test::EtcdDaemon* EtcdClientTest::etcd_ = nullptr;
std::string EtcdClientTest::skip_;

TEST_F(EtcdClientTest, PutGetAndDeleteRoundTripArbitraryBytes) {
  const std::string key = prefix_ + std::string("a\0b\xff\x80", 5);
  const std::string value = all_bytes();
  EXPECT_FALSE(client_->get(key).has_value());
  const int64_t rev1 = client_->put(key, value);
  std::optional<EtcdKeyValue> kv = client_->get(key);
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->key, key);
  EXPECT_EQ(kv->value, value);
  EXPECT_EQ(kv->create_revision, rev1);
  EXPECT_EQ(kv->mod_revision, rev1);
  EXPECT_EQ(kv->version, 1);
  EXPECT_EQ(kv->lease, 0);

  const int64_t rev2 = client_->put(key, "");  // an empty value is a value (absent on the wire)
  EXPECT_GT(rev2, rev1);
  kv = client_->get(key);
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->value, "");
  EXPECT_EQ(kv->create_revision, rev1);
  EXPECT_EQ(kv->mod_revision, rev2);
  EXPECT_EQ(kv->version, 2);

  EXPECT_EQ(client_->erase(key), 1);
  EXPECT_FALSE(client_->get(key).has_value());
  EXPECT_EQ(client_->erase(key), 0);
}

TEST_F(EtcdClientTest, PrefixRangeSelectsExactlyThePrefix) {
  // Keys around the prefix boundary, including a prefix ending in 0xff (whose range end is
  // the previous byte incremented, not 0xff + 1).
  const std::string p = prefix_ + "n/";
  const std::string ff = prefix_ + "\xff";
  for (const std::string& k : {p + "2", p + "1", p + std::string("\xff\xff", 2), prefix_ + "n0",
                               prefix_ + "n", ff + "a", ff + "\xff", prefix_ + "o"})
    client_->put(k, "v:" + k);
  std::vector<EtcdKeyValue> kvs = client_->get_prefix(p);
  ASSERT_EQ(kvs.size(), 3u);
  EXPECT_EQ(kvs[0].key, p + "1");  // sorted by key bytes
  EXPECT_EQ(kvs[1].key, p + "2");
  EXPECT_EQ(kvs[2].key, p + std::string("\xff\xff", 2));
  EXPECT_EQ(kvs[2].value, "v:" + kvs[2].key);

  kvs = client_->get_prefix(ff);
  ASSERT_EQ(kvs.size(), 2u);
  EXPECT_EQ(kvs[0].key, ff + "a");
  EXPECT_EQ(kvs[1].key, ff + "\xff");

  EXPECT_EQ(client_->erase_prefix(p), 3);
  EXPECT_TRUE(client_->get_prefix(p).empty());
  EXPECT_EQ(client_->get_prefix(prefix_).size(), 5u);  // the neighbours are untouched
  EXPECT_EQ(client_->erase_prefix(prefix_), 5);
}

TEST_F(EtcdClientTest, TxnRunsTheBranchItsComparisonsChoose) {
  const std::string k = prefix_ + "k";
  // Absent -> success branch: put, then a get inside the same txn sees it.
  EtcdTxnResult r = client_->txn({EtcdCompare::absent(k)}, {EtcdOp::put(k, "one"), EtcdOp::get(k)},
                                 {EtcdOp::get(k)});
  EXPECT_TRUE(r.succeeded);
  ASSERT_EQ(r.ranges.size(), 2u);
  EXPECT_TRUE(r.ranges[0].empty());  // the put's slot
  ASSERT_EQ(r.ranges[1].size(), 1u);
  EXPECT_EQ(r.ranges[1][0].value, "one");
  const int64_t created = r.revision;

  // Present -> failure branch, which returns the record; nothing was written.
  r = client_->txn({EtcdCompare::absent(k)}, {EtcdOp::put(k, "two")}, {EtcdOp::get(k)});
  EXPECT_FALSE(r.succeeded);  // absent from the JSON: proto3 leaves out false
  ASSERT_EQ(r.ranges.size(), 1u);
  ASSERT_EQ(r.ranges[0].size(), 1u);
  EXPECT_EQ(r.ranges[0][0].value, "one");
  EXPECT_EQ(r.ranges[0][0].create_revision, created);

  // Value and mod-revision comparisons, both outcomes.
  EXPECT_FALSE(
      client_->txn({EtcdCompare::value_is(k, "two")}, {EtcdOp::put(k, "x")}, {}).succeeded);
  EXPECT_TRUE(client_
                  ->txn({EtcdCompare::value_is(k, "one"), EtcdCompare::mod_revision_is(k, created)},
                        {EtcdOp::put(k, "three")}, {})
                  .succeeded);
  EXPECT_FALSE(client_->txn({EtcdCompare::mod_revision_is(k, created)}, {EtcdOp::put(k, "x")}, {})
                   .succeeded);
  EXPECT_FALSE(
      client_->txn({EtcdCompare::value_is(prefix_ + "missing", "")}, {EtcdOp::put(k, "x")}, {})
          .succeeded);  // a missing key matches no value, not even the empty one
  EXPECT_EQ(client_->get(k)->value, "three");

  // A delete in a branch.
  EXPECT_TRUE(client_->txn({EtcdCompare::value_is(k, "three")}, {EtcdOp::erase(k)}, {}).succeeded);
  EXPECT_FALSE(client_->get(k).has_value());
}

// A key under a lease that nobody renews is gone within TTL + margin after the grant, and not
// before the TTL; afterwards the lease is unknown: keepalive says 0, a put under it PeerLost.
TEST_F(EtcdClientTest, LeaseExpiryRemovesTheKeyWithinTheTtl) {
  const std::string k = prefix_ + "k";
  const auto granted_at = Clock::now();
  const EtcdLease lease = client_->grant(2);
  EXPECT_EQ(lease.ttl_s, 2);
  EXPECT_GT(lease.id, int64_t(1) << 53) << "expected a lease id above 2^53 (kept exact)";
  client_->put(k, "v", lease.id);
  ASSERT_TRUE(client_->get(k).has_value());
  EXPECT_EQ(client_->get(k)->lease, lease.id);
  // Polling here measures when it vanishes; it synchronises nothing.
  while (client_->get(k).has_value() && seconds_since(granted_at) < 5.0)
    std::this_thread::sleep_for(milliseconds(20));
  const double gone_after = seconds_since(granted_at);
  std::printf("lease expiry: TTL 2 s key gone %.3f s after the grant\n", gone_after);
  EXPECT_GE(gone_after, 1.9);
  EXPECT_LE(gone_after, 4.0);  // TTL + 2 s: etcd checks expiry about every 0.5 s, then commits
  EXPECT_EQ(client_->keepalive(lease.id), 0);
  EXPECT_THROW(client_->put(k, "v", lease.id), PeerLost);
  EXPECT_FALSE(client_->get(k).has_value());
}

TEST_F(EtcdClientTest, KeepaliveKeepsTheKeyAndRevokeRemovesItAtOnce) {
  const std::string k = prefix_ + "k";
  const EtcdLease lease = client_->grant(2);
  client_->put(k, "v", lease.id);
  // Renewed every 0.5 s for 4.5 s — more than twice the TTL.
  const auto t0 = Clock::now();
  while (seconds_since(t0) < 4.5) {
    EXPECT_EQ(client_->keepalive(lease.id), 2);
    ASSERT_TRUE(client_->get(k).has_value()) << "gone after " << seconds_since(t0) << " s";
    std::this_thread::sleep_for(milliseconds(500));
  }
  EXPECT_TRUE(client_->revoke(lease.id));
  EXPECT_FALSE(client_->get(k).has_value());
  EXPECT_EQ(client_->keepalive(lease.id), 0);
  EXPECT_FALSE(client_->revoke(lease.id));  // gone already: a retried revoke is harmless
  try {
    client_->put(k, "v", lease.id);
    FAIL() << "put under a revoked lease";
  } catch (const PeerLost& e) {
    EXPECT_NE(std::string(e.what()).find("lease not found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(etcd_->endpoints()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(client_->get(k).has_value());
}

// Two agents campaign at once: exactly one wins and both name it. The winner stops renewing;
// the loser, polling, wins once the winner's lease has expired. The deposed leader's fenced
// write then fails and writes nothing; the new leader's lands.
TEST_F(EtcdClientTest, ElectionHasOneWinnerAndTheDeposedLeaderIsFenced) {
  std::unique_ptr<EtcdClient> other = other_client();
  EtcdElection ea(*client_, prefix_ + "leader");
  EtcdElection eb(*other, prefix_ + "leader");
  const EtcdLease la = client_->grant(2);
  const EtcdLease lb = other->grant(2);
  Leadership ra, rb;
  std::atomic<int> ready{0};
  auto race = [&ready](EtcdElection& e, const std::string& id, int64_t lease, Leadership* out) {
    ++ready;
    while (ready.load() < 2) {
    }
    *out = e.campaign(id, lease);
  };
  std::thread ta(race, std::ref(ea), "agent-a", la.id, &ra);
  std::thread tb(race, std::ref(eb), "agent-b", lb.id, &rb);
  ta.join();
  tb.join();
  ASSERT_NE(ra.won, rb.won) << "exactly one campaign must win";
  EXPECT_EQ(ra.leader, rb.leader);
  EXPECT_EQ(ra.term, rb.term);
  const bool a_won = ra.won;
  EtcdClient& wc = a_won ? *client_ : *other;
  EtcdClient& lc = a_won ? *other : *client_;
  EtcdElection& we = a_won ? ea : eb;
  EtcdElection& le = a_won ? eb : ea;
  const std::string wid = a_won ? "agent-a" : "agent-b";
  const std::string lid = a_won ? "agent-b" : "agent-a";
  const EtcdLease wl = a_won ? la : lb;
  const EtcdLease ll = a_won ? lb : la;
  EXPECT_EQ(ra.leader, wid);
  // A retried campaign of the winner (its first reply lost) is still won; the loser's is not.
  EXPECT_TRUE(we.campaign(wid, wl.id).won);
  EXPECT_FALSE(le.campaign(lid, ll.id).won);
  // The leader writes under fencing; the loser cannot.
  EXPECT_TRUE(we.fenced_put(prefix_ + "gen/0", "by " + wid, wid, /*create_only=*/true));
  EXPECT_FALSE(le.fenced_put(prefix_ + "gen/1", "by " + lid, lid));
  EXPECT_FALSE(wc.get(prefix_ + "gen/1").has_value());

  // The winner stops renewing; the loser renews its own lease and campaigns every 100 ms.
  const auto t0 = Clock::now();
  Leadership now;
  while (!(now = le.campaign(lid, ll.id)).won && seconds_since(t0) < 6.0) {
    EXPECT_EQ(lc.keepalive(ll.id), 2);
    std::this_thread::sleep_for(milliseconds(100));
  }
  const double took = seconds_since(t0);
  std::printf("election: the loser won %.3f s after the winner stopped renewing (TTL 2 s)\n", took);
  ASSERT_TRUE(now.won) << "the loser did not win within 6 s";
  EXPECT_LE(took, 4.0);  // TTL + 2 s, as for any lease
  EXPECT_GT(now.term, ra.term);
  EXPECT_EQ(le.leader()->leader, lid);

  // Fencing: the deposed leader still believes it leads; its write fails and writes nothing.
  EXPECT_FALSE(we.fenced_put(prefix_ + "gen/1", "stale by " + wid, wid, /*create_only=*/true));
  EXPECT_FALSE(we.fenced_put(prefix_ + "gen/0", "stale by " + wid, wid));
  EXPECT_FALSE(wc.get(prefix_ + "gen/1").has_value());
  EXPECT_EQ(wc.get(prefix_ + "gen/0")->value, "by " + wid);
  // The new leader's writes land; a write-once key is written once.
  EXPECT_TRUE(le.fenced_put(prefix_ + "gen/1", "by " + lid, lid, /*create_only=*/true));
  EXPECT_FALSE(le.fenced_put(prefix_ + "gen/1", "again", lid, /*create_only=*/true));
  EXPECT_EQ(lc.get(prefix_ + "gen/1")->value, "by " + lid);
  // The old leader campaigning again, with a new lease, loses to the holder.
  const EtcdLease fresh = wc.grant(2);
  const Leadership back = we.campaign(wid, fresh.id);
  EXPECT_FALSE(back.won);
  EXPECT_EQ(back.leader, lid);
  // Resigning frees the key at once (only its holder can).
  EXPECT_FALSE(we.resign(wid));
  EXPECT_TRUE(le.resign(lid));
  EXPECT_FALSE(le.leader().has_value());
  EXPECT_TRUE(we.campaign(wid, fresh.id).won);
  EXPECT_TRUE(wc.revoke(fresh.id));
  EXPECT_TRUE(lc.revoke(ll.id));
}

// Requests on one kept-alive connection with TCP_NODELAY: well under the 45 ms that Nagle
// against the delayed ACK costs per request without it (§15.6).
TEST_F(EtcdClientTest, RequestsOverTheKeptAliveConnectionTakeAboutAMillisecond) {
  const std::string k = prefix_ + "k";
  const int n = 200;
  client_->put(k, "warm");
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) client_->put(k, std::string(64, char('a' + i % 26)));
  const double put_ms = seconds_since(t0) * 1000 / n;
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) ASSERT_TRUE(client_->get(k).has_value());
  const double get_ms = seconds_since(t0) * 1000 / n;
  const std::string p = prefix_ + "p/";
  for (int i = 0; i < 16; ++i) client_->put(p + std::to_string(i), "v");
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) ASSERT_EQ(client_->get_prefix(p).size(), 16u);
  const double range_ms = seconds_since(t0) * 1000 / n;
  std::printf(
      "latency over loopback: put %.3f ms, get %.3f ms, range of 16 keys %.3f ms (mean of %d)\n",
      put_ms, get_ms, range_ms, n);
  RecordProperty("put_ms", std::to_string(put_ms));
  RecordProperty("get_ms", std::to_string(get_ms));
  EXPECT_LT(put_ms, 20.0);
  EXPECT_LT(get_ms, 20.0);
  EXPECT_LT(range_ms, 20.0);
}

// A refusal (4xx) is etcd's verdict: thrown at once as Error with etcd's message, not retried
// on other members until the timeout.
TEST_F(EtcdClientTest, ARefusalIsThrownAtOnceWithEtcdsMessage) {
  const auto t0 = Clock::now();
  try {
    // Over the 2 MiB message limit of the gateway's gRPC client: HTTP 429, gRPC code 8.
    client_->put(prefix_ + "big", std::string(2 << 20, 'x'));
    FAIL() << "etcd took a 2 MiB put";
  } catch (const Timeout& e) {
    FAIL() << "retried a refusal: " << e.what();
  } catch (const Error& e) {
    EXPECT_LT(seconds_since(t0), 1.0);
    const std::string what = e.what();
    EXPECT_NE(what.find("larger than max"), std::string::npos) << what;
    EXPECT_NE(what.find(etcd_->endpoints()), std::string::npos) << what;
  }
  EXPECT_FALSE(client_->get(prefix_ + "big").has_value());
}

TEST_F(EtcdClientTest, RequireEtcdReturnsTheStatusOfALiveMember) {
  const EtcdStatus st =
      require_etcd("--rdzv-endpoints", etcd_->endpoints(), milliseconds(5000), "comm.timeout_s");
  EXPECT_EQ(st.endpoint, etcd_->endpoints());
  EXPECT_NE(st.member_id, 0u);
  EXPECT_EQ(st.leader_id, st.member_id);  // one member leads itself
  EXPECT_GE(st.raft_term, 1);
}

TEST_F(EtcdClientTest, FailsOverFromADeadEndpointToALiveOne) {
  const std::string dead = "127.0.0.1:" + std::to_string(test::closed_port());
  EtcdClient client(options_for(dead + "," + etcd_->endpoints(), milliseconds(5000)));
  EXPECT_EQ(client.current_endpoint(), dead);
  const auto t0 = Clock::now();
  client.put(prefix_ + "k", "v");
  EXPECT_LT(seconds_since(t0), 1.0);  // a refused connection fails at once
  EXPECT_EQ(client.current_endpoint(), etcd_->endpoints());
  EXPECT_EQ(client.get(prefix_ + "k")->value, "v");
}

// Three members; the raft leader, which is also the member the client talks to, is SIGKILLed:
// the next calls go to the others once they have elected a new leader, and what was written
// before is there, lease included.
TEST(EtcdCluster, ClientKeepsWorkingWhenTheLeaderMemberDies) {
  std::string skip;
  std::unique_ptr<test::EtcdDaemon> etcd = test::EtcdDaemon::start(3, &skip);
  if (!etcd) GTEST_SKIP() << skip;
  const std::vector<std::string>& members = etcd->endpoint_list();
  // Which member leads: ask each; the one whose own ID is the leader's.
  size_t leader = members.size();
  for (size_t i = 0; i < members.size(); ++i) {
    EtcdClient one(options_for(members[i], milliseconds(5000)));
    const EtcdStatus st = one.status();
    if (st.member_id == st.leader_id) leader = i;
  }
  ASSERT_LT(leader, members.size()) << "no member says it leads";
  std::string endpoints = members[leader];  // the leader first: the client's current member
  for (size_t i = 0; i < members.size(); ++i)
    if (i != leader) endpoints += "," + members[i];
  EtcdClient client(options_for(endpoints, milliseconds(15000)));
  const EtcdLease lease = client.grant(10);
  client.put("/c/before", "1", lease.id);
  ASSERT_EQ(client.current_endpoint(), members[leader]);
  etcd->kill_member(leader);

  const auto t0 = Clock::now();
  client.put("/c/after", "2");
  const double first = seconds_since(t0);
  std::printf("cluster: first put after the leader member's death took %.3f s, via %s\n", first,
              client.current_endpoint().c_str());
  EXPECT_NE(client.current_endpoint(), members[leader]);
  // One attempt_timeout (3 s) on a stalled follower, then an answer: under the 7 s that
  // etcd's own request timeout would cost.
  EXPECT_LT(first, 6.0);
  EXPECT_EQ(client.get("/c/before")->value, "1");
  EXPECT_EQ(client.get_prefix("/c/").size(), 2u);
  EXPECT_EQ(client.keepalive(lease.id), 10);
  EXPECT_TRUE(
      client.txn({EtcdCompare::value_is("/c/after", "2")}, {EtcdOp::put("/c/after", "3")}, {})
          .succeeded);
  EXPECT_EQ(client.get("/c/after")->value, "3");
  const EtcdStatus st = client.status();
  EXPECT_NE(st.leader_id, 0u);  // a new leader
}

}  // namespace
}  // namespace krab::elastic
