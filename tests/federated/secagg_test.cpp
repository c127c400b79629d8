// The secure-aggregation protocol end to end: sums with and without dropouts, what the server
// sees of one client, the clients' refusals, corrupt and truncated messages, and a 100-client
// round. Every message goes through to_bytes()/from_bytes() on its way, as it would over gRPC.
#include "federated/secagg.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "core/errors.h"

namespace krab::federated::secagg {
namespace {

template <typename M>
M wire(const M& m) {
  return M::from_bytes(m.to_bytes());
}

std::vector<float> random_floats(size_t n, float amplitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-amplitude, amplitude);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// n clients with ids 3, 10, 17, ... (not 1..n: ids are arbitrary Shamir x-coordinates) and
// one server, driven step by step. Clients in `gone` take no further part: that is a dropout.
struct Harness {
  Config cfg;
  std::unique_ptr<Server> server;
  std::map<uint64_t, Client> clients;
  std::map<uint64_t, std::vector<float>> updates;
  std::set<uint64_t> gone;

  Harness(size_t n, size_t t, size_t m, float amplitude = 1.0f) {
    cfg.round = 42;
    cfg.vector_length = m;
    cfg.threshold = t;
    cfg.clients = n;
    cfg.fp = FixedPoint::for_clients(1.0, n);
    server = std::make_unique<Server>(cfg);
    for (size_t k = 0; k < n; ++k) {
      const uint64_t id = 3 + 7 * k;
      clients.emplace(id, Client(id, cfg));
      updates[id] = random_floats(m, amplitude, static_cast<uint32_t>(id));
    }
  }
  uint64_t id(size_t k) const { return 3 + 7 * k; }
  bool active(uint64_t id) const { return !gone.count(id); }

  void advertise() {
    for (auto& [id, c] : clients)
      if (active(id)) server->receive(wire(c.advertise_keys()));
  }
  void share() {
    const Roster roster = wire(server->roster());
    for (auto& [id, c] : clients)
      if (active(id)) server->receive(wire(c.share_keys(roster)));
  }
  void mask() {
    for (auto& [id, c] : clients)
      if (active(id))
        server->receive(wire(c.masked_input(wire(server->shares_for(id)), updates[id])));
  }
  void unmask() {
    const UnmaskRequest request = wire(server->unmask_request());
    for (auto& [id, c] : clients)
      if (active(id)) server->receive(wire(c.unmask(request)));
  }

  // The independent expectation: the plain sum in double.
  std::vector<double> plain_sum(const std::vector<uint64_t>& ids) const {
    std::vector<double> s(cfg.vector_length, 0.0);
    for (uint64_t id : ids)
      for (size_t i = 0; i < s.size(); ++i) s[i] += updates.at(id)[i];
    return s;
  }
  // Fixed-point rounding (n * 0.5 / scale) plus float32 rounding of the decoded sum.
  void expect_sum(const Result& r, const std::vector<uint64_t>& ids) const {
    ASSERT_EQ(r.counted, ids);
    const auto want = plain_sum(ids);
    ASSERT_EQ(r.sum.size(), want.size());
    const double tol = ids.size() * 0.5 / cfg.fp.scale;
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(r.sum[i], want[i], tol + std::abs(want[i]) * 1.2e-7) << "coordinate " << i;
  }
};

TEST(SecAgg, FiveClientsNoDropoutsSumExactlyWithinFixedPointPrecision) {
  Harness h(5, 3, 1000);
  h.advertise();
  h.share();
  h.mask();
  h.unmask();
  const Result& r = h.server->result();
  h.expect_sum(r, {3, 10, 17, 24, 31});
  EXPECT_EQ(r.responders, (std::vector<uint64_t>{3, 10, 17, 24, 31}));
  EXPECT_TRUE(h.server->unmask_request().dropped.empty());
  EXPECT_EQ(&h.server->result(), &r);  // computed once
}

TEST(SecAgg, OneMaskedInputAloneLooksRandom) {
  Harness h(5, 3, 4000, /*amplitude=*/0.01f);
  h.advertise();
  h.share();
  const uint64_t u = h.id(2);
  Client& c = h.clients.at(u);
  const MaskedInput y = c.masked_input(h.server->shares_for(u), h.updates[u]);
  // Decoded on its own, y_u is uniform over the whole fixed-point range (here +-8), while the
  // update is within +-0.01: the mean distance is ~4, hundreds of times the update's scale.
  const auto decoded = h.cfg.fp.decode_sum(y.y, 1);
  const auto encoded = h.cfg.fp.encode(h.updates[u]);
  double mean_abs = 0;
  size_t equal = 0;
  for (size_t i = 0; i < decoded.size(); ++i) {
    mean_abs += std::abs(decoded[i] - h.updates[u][i]);
    equal += y.y[i] == encoded[i];
  }
  mean_abs /= decoded.size();
  EXPECT_GT(mean_abs, 1.0);
  EXPECT_LT(equal, 5u);
}

TEST(SecAgg, DropoutsInEveryRoundAreRecovered) {
  // 10 clients, t = 5: clients 0, 1 vanish after advertising (never share), 2, 3 after sharing
  // (their pairwise masks are removed via s_sk shares), 4 sends y_u but never answers round 3
  // (it still counts). 6 masked inputs, 5 responders = t.
  Harness h(10, 5, 500);
  h.advertise();
  h.gone = {h.id(0), h.id(1)};
  h.share();
  h.gone.insert({h.id(2), h.id(3)});
  h.mask();
  h.gone.insert(h.id(4));
  h.unmask();
  const Result& r = h.server->result();
  const std::vector<uint64_t> counted = {h.id(4), h.id(5), h.id(6), h.id(7), h.id(8), h.id(9)};
  h.expect_sum(r, counted);
  EXPECT_EQ(r.responders, (std::vector<uint64_t>{h.id(5), h.id(6), h.id(7), h.id(8), h.id(9)}));
  EXPECT_EQ(h.server->unmask_request().dropped, (std::vector<uint64_t>{h.id(2), h.id(3)}));
}

TEST(SecAgg, TooFewRound3AnswersIsAnErrorNamingTheNumbers) {
  Harness h(10, 5, 100);
  h.advertise();
  h.gone = {h.id(0), h.id(1), h.id(2), h.id(3)};
  h.share();
  h.mask();
  h.gone.insert({h.id(4), h.id(5)});  // 6 survivors, 4 answer
  h.unmask();
  try {
    h.server->result();
    FAIL() << "expected krab::Error";
  } catch (const InvalidArgument&) {
    FAIL() << "expected a plain krab::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("only 4 of 6"), std::string::npos) << what;
    EXPECT_NE(what.find("threshold is 5"), std::string::npos) << what;
  }
  // A late answer fixes it: the round is still open.
  const UnmaskRequest q = h.server->unmask_request();
  h.server->receive(h.clients.at(h.id(4)).unmask(q));
  h.expect_sum(h.server->result(), {h.id(4), h.id(5), h.id(6), h.id(7), h.id(8), h.id(9)});
}

TEST(SecAgg, TooFewClientsAtEachStepIsAnError) {
  Harness h(4, 4, 10);
  h.gone = {h.id(0)};
  h.advertise();
  try {
    h.server->roster();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 3 clients advertised"), std::string::npos);
  }
  Harness g(4, 3, 10);
  g.advertise();
  g.gone = {g.id(0), g.id(1)};
  g.share();
  EXPECT_THROW(g.server->shares_for(g.id(2)), Error);
}

TEST(SecAgg, ClientRefusesUnmaskRequestsThatWouldRevealAnUpdate) {
  Harness h(6, 3, 50);
  h.advertise();
  h.gone = {h.id(5)};
  h.share();
  h.gone = {h.id(4), h.id(5)};
  h.mask();
  const UnmaskRequest good = h.server->unmask_request();
  ASSERT_EQ(good.dropped, (std::vector<uint64_t>{h.id(4)}));
  Client& c = h.clients.at(h.id(0));
  const auto expect_refusal = [&](UnmaskRequest q, const std::string& id) {
    try {
      c.unmask(q);
      FAIL() << "expected a refusal";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(id), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("refuses"), std::string::npos) << e.what();
    }
  };
  UnmaskRequest both = good;
  both.dropped.push_back(h.id(1));  // 10 both survivor and dropped: b_10 and s_sk_10 together
  expect_refusal(both, "client 10 is listed both");
  UnmaskRequest not_me = good;
  not_me.survivors.erase(not_me.survivors.begin());
  not_me.dropped.insert(not_me.dropped.begin(), h.id(0));
  expect_refusal(not_me, "client 3 refuses the unmask request: it is not listed as a survivor");
  UnmaskRequest few = good;
  few.dropped = {h.id(2), h.id(3), h.id(4)};
  few.survivors = {h.id(0), h.id(1)};
  expect_refusal(few, "fewer than the threshold 3");
  UnmaskRequest missing = good;
  missing.dropped.clear();
  expect_refusal(missing, "leaves out client 31");
  UnmaskRequest stranger = good;
  stranger.dropped.push_back(h.id(5));  // never shared: the client holds nothing for it
  expect_refusal(stranger, "client 38 did not share keys");
  // The genuine request is answered, once; a second, different request is refused.
  EXPECT_NO_THROW(c.unmask(good));
  UnmaskRequest flipped = good;
  flipped.survivors = {h.id(0), h.id(1), h.id(2)};
  flipped.dropped = {h.id(3), h.id(4)};
  expect_refusal(flipped, "second unmask request");
}

TEST(SecAgg, TamperedCiphertextIsCorruptAndTheClientCanStillGoOn) {
  Harness h(4, 3, 20);
  h.advertise();
  h.share();
  const uint64_t v = h.id(1);
  const IncomingShares good = h.server->shares_for(v);
  ASSERT_EQ(good.shares.size(), 3u);
  IncomingShares flipped = good;
  flipped.shares[1].ciphertext[7] ^= 0x20;
  EXPECT_THROW(h.clients.at(v).masked_input(flipped, h.updates[v]), CorruptData);
  // The server cannot redirect u's share for w to v: the key and the AAD name the recipient.
  IncomingShares redirected = h.server->shares_for(h.id(2));
  for (auto& e : redirected.shares) e.to = v;
  redirected.client_id = v;
  redirected.shares.erase(redirected.shares.begin() + 1);  // drop v's own share to the other
  EXPECT_THROW(h.clients.at(v).masked_input(redirected, h.updates[v]), CorruptData);
  // Nothing was committed: the genuine shares still work, and the run completes.
  h.gone = {v};
  h.mask();
  h.server->receive(h.clients.at(v).masked_input(good, h.updates[v]));
  h.gone.clear();
  h.unmask();
  h.expect_sum(h.server->result(), {h.id(0), h.id(1), h.id(2), h.id(3)});
}

TEST(SecAgg, WrongLengthUpdateAndOutOfOrderCallsAreInvalidArguments) {
  Harness h(3, 2, 8);
  Client& c = h.clients.at(h.id(0));
  EXPECT_THROW(c.share_keys(Roster{}), InvalidArgument);  // before advertise_keys
  h.advertise();
  EXPECT_THROW(c.advertise_keys(), InvalidArgument);  // twice
  EXPECT_THROW(h.server->receive(AdvertiseKeys{42, h.id(0), {}, {}}), InvalidArgument);
  EXPECT_THROW(h.server->receive(ShareKeys{42, h.id(0), {}}), InvalidArgument);  // before roster
  h.share();
  const IncomingShares in = h.server->shares_for(h.id(0));
  EXPECT_THROW(c.masked_input(in, std::vector<float>(7, 0.0f)), InvalidArgument);
  EXPECT_THROW(c.masked_input(in, std::vector<float>(9, 0.0f)), InvalidArgument);
  EXPECT_THROW(c.unmask(UnmaskRequest{}), InvalidArgument);  // before masked_input
  const MaskedInput y = c.masked_input(in, h.updates[h.id(0)]);
  MaskedInput stale = y;
  stale.round = 41;
  EXPECT_THROW(h.server->receive(stale), InvalidArgument);
  MaskedInput short_y = y;
  short_y.y.pop_back();
  EXPECT_THROW(h.server->receive(short_y), InvalidArgument);
  h.server->receive(y);
  EXPECT_THROW(h.server->receive(y), InvalidArgument);  // twice
  EXPECT_THROW(Client(0, h.cfg), InvalidArgument);
  Config bad = h.cfg;
  bad.threshold = 0;
  EXPECT_THROW(Server{bad}, InvalidArgument);
}

// A wrong share of a survivor's self-mask seed in round 3 reconstructs a wrong seed. Most wrong
// shares already fail Shamir's consistency check; what is left (shares consistent with another
// seed, e.g. a client that split one seed and masked with another) is caught by the commitment
// sent with the masked input. Either way it is CorruptData, never a silently wrong sum.
TEST(SecAgg, AWrongSelfMaskSeedIsAnErrorNotAWrongSum) {
  auto run = [](bool bad_share, bool bad_commitment) {
    Harness h(4, 4, 16);  // t = n: every share is needed, so a bad one cannot be outvoted
    h.advertise();
    h.share();
    for (auto& [id, c] : h.clients) {
      MaskedInput y = c.masked_input(wire(h.server->shares_for(id)), h.updates[id]);
      if (bad_commitment && id == h.id(1)) y.b_commitment[0] ^= 0x01;
      h.server->receive(wire(y));
    }
    const UnmaskRequest request = wire(h.server->unmask_request());
    bool tampered = false;
    for (auto& [id, c] : h.clients) {
      UnmaskResponse r = c.unmask(request);
      if (bad_share && !tampered && !r.self_mask_shares.empty()) {
        std::vector<uint8_t> bytes = r.self_mask_shares[0].share.to_bytes();
        bytes.back() ^= 0x01;  // still a well-formed share, of another value
        r.self_mask_shares[0].share = shamir::Share::from_bytes(bytes.data(), bytes.size());
        tampered = true;
      }
      h.server->receive(wire(r));
    }
    try {
      h.server->result();
      return std::string("(a result)");
    } catch (const CorruptData& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(run(false, false), "(a result)");
  EXPECT_NE(run(true, false), "(a result)");
  EXPECT_NE(run(false, true).find("does not match its commitment"), std::string::npos)
      << run(false, true);
}

// Round 3 with some answers carrying a bad share (well-formed, of another value: the hardest
// kind, since it parses). `liars` are positions in the harness; each corrupts its share of the
// self-mask seed of survivor `victim` (or, with `key`, of a dropped client's key).
struct BadShares {
  Result result;
  std::string error;
};
BadShares run_with_bad_shares(Harness& h, const std::set<size_t>& liars, size_t victim,
                              bool key = false) {
  h.advertise();
  h.share();
  if (key) h.gone = {h.id(victim)};  // shares, then drops: its key must be reconstructed
  h.mask();
  h.gone.clear();
  const UnmaskRequest request = wire(h.server->unmask_request());
  for (auto& [id, c] : h.clients) {
    if (!std::count(request.survivors.begin(), request.survivors.end(), id)) continue;
    UnmaskResponse r = c.unmask(request);
    bool liar = false;
    for (size_t k : liars) liar |= id == h.id(k);
    for (auto* list : {&r.self_mask_shares, &r.key_shares})
      for (OwnedShare& s : *list)
        if (liar && s.owner == h.id(victim)) s.share.y[0] = (s.share.y[0] + 1) % shamir::kPrime;
    h.server->receive(wire(r));
  }
  BadShares out;
  try {
    out.result = h.server->result();
  } catch (const CorruptData& e) {
    out.error = e.what();
  }
  return out;
}

TEST(SecAgg, ABadShareSetsAsideExactlyItsSenderAndTheSumStaysExact) {
  // A liar among the first t answers (the set tried first), one after them, two at once, and a
  // bad share of a dropped client's key: each is named, and the others' sum is exact.
  struct Case {
    std::set<size_t> liars;
    size_t victim;
    bool key;
  };
  for (const Case& k :
       {Case{{0}, 3, false}, Case{{5}, 1, false}, Case{{1, 4}, 0, false}, Case{{2}, 6, true}}) {
    Harness h(7, 4, 64);
    const BadShares got = run_with_bad_shares(h, k.liars, k.victim, k.key);
    ASSERT_EQ(got.error, "") << *k.liars.begin();
    std::vector<uint64_t> bad, good, counted;
    for (size_t i = 0; i < 7; ++i) {
      if (k.key && i == k.victim) continue;
      counted.push_back(h.id(i));
      (k.liars.count(i) ? bad : good).push_back(h.id(i));
    }
    EXPECT_EQ(got.result.bad_shares, bad);
    EXPECT_EQ(got.result.responders, good);
    h.expect_sum(got.result, counted);
  }
}

TEST(SecAgg, TheRoundFailsOnlyWhenFewerThanTGoodAnswersRemain) {
  Harness h(5, 3, 16);  // 5 answers, t = 3: two liars leave 3 good ones, three leave 2
  const BadShares two = run_with_bad_shares(h, {0, 1}, 4);
  ASSERT_EQ(two.error, "");
  EXPECT_EQ(two.result.bad_shares, (std::vector<uint64_t>{h.id(0), h.id(1)}));
  h.expect_sum(two.result, {h.id(0), h.id(1), h.id(2), h.id(3), h.id(4)});
  Harness h3(5, 3, 16);
  const BadShares three = run_with_bad_shares(h3, {0, 1, 2}, 4);
  EXPECT_NE(three.error.find("does not match its commitment"), std::string::npos) << three.error;
  EXPECT_NE(three.error.find("no other 3 of the 5 answers"), std::string::npos) << three.error;
}

TEST(SecAgg, TheServerTakesNoMoreAdvertisersThanTheRoundWasAnnouncedFor) {
  Harness h(4, 3, 8);
  h.cfg.clients = 3;
  Server small(h.cfg);
  size_t k = 0;
  for (auto& [id, c] : h.clients) {
    const AdvertiseKeys keys = c.advertise_keys();
    if (k++ < 3) {
      small.receive(keys);
    } else {
      EXPECT_THROW(small.receive(keys), InvalidArgument);
    }
  }
  EXPECT_EQ(small.roster().clients.size(), 3u);
}

TEST(SecAgg, RosterChecksOnTheClient) {
  Harness h(4, 3, 8);
  h.advertise();
  const Roster roster = h.server->roster();
  Client& c = h.clients.at(h.id(0));
  Roster without_me = roster;
  without_me.clients.erase(without_me.clients.begin());
  EXPECT_THROW(c.share_keys(without_me), InvalidArgument);
  Roster dup = roster;
  dup.clients.push_back(dup.clients.back());
  EXPECT_THROW(c.share_keys(dup), InvalidArgument);
  Roster short_roster = roster;
  short_roster.clients.resize(2);
  EXPECT_THROW(c.share_keys(short_roster), InvalidArgument);
  Roster swapped = roster;
  swapped.clients[0].s_pk = swapped.clients[1].s_pk;
  EXPECT_THROW(c.share_keys(swapped), InvalidArgument);
  // Distinct ids but one public key twice (another client's, or the same client's two keys).
  for (int which = 0; which < 3; ++which) {
    Roster same_key = roster;
    auto& other = same_key.clients[2];
    if (which == 0) other.c_pk = same_key.clients[3].c_pk;
    if (which == 1) other.s_pk = same_key.clients[3].s_pk;
    if (which == 2) other.s_pk = other.c_pk;
    try {
      c.share_keys(same_key);
      ADD_FAILURE() << "roster " << which << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("the same public key"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(c.share_keys(roster));
}

// Every prefix (sampled for long messages), one byte too many, and a wrong tag are CorruptData.
template <typename M>
void expect_rejects_damaged(const M& m) {
  const auto bytes = m.to_bytes();
  EXPECT_NO_THROW(M::from_bytes(bytes));
  for (size_t n = 0; n < bytes.size(); n += (n < 300 ? 1 : 97))
    EXPECT_THROW(M::from_bytes(bytes.data(), n), CorruptData) << n << " of " << bytes.size();
  EXPECT_THROW(M::from_bytes(bytes.data(), bytes.size() - 1), CorruptData);
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(M::from_bytes(longer), CorruptData);
  auto tag = bytes;
  tag[1] ^= 0x40;
  EXPECT_THROW(M::from_bytes(tag), CorruptData);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    auto garbage = bytes;
    for (size_t i = 4; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(rng());
    try {
      M::from_bytes(garbage);  // may parse (e.g. random ids and keys); must not crash
    } catch (const CorruptData&) {
    }
  }
}

TEST(SecAgg, TruncatedOversizedAndGarbageMessagesAreCorrupt) {
  Harness h(4, 3, 600);
  const AdvertiseKeys adv = h.clients.at(h.id(0)).advertise_keys();
  expect_rejects_damaged(adv);
  h.server->receive(adv);
  for (size_t k = 1; k < 4; ++k) h.server->receive(h.clients.at(h.id(k)).advertise_keys());
  expect_rejects_damaged(h.server->roster());
  const Roster roster = h.server->roster();
  for (auto& [id, c] : h.clients) {
    const ShareKeys sk = c.share_keys(roster);
    if (id == h.id(0)) expect_rejects_damaged(sk);
    h.server->receive(sk);
  }
  const IncomingShares in = h.server->shares_for(h.id(0));
  expect_rejects_damaged(in);
  IncomingShares huge_count = in;
  auto bytes = huge_count.to_bytes();
  bytes[20] = bytes[21] = bytes[22] = bytes[23] = 0xff;  // the share count
  EXPECT_THROW(IncomingShares::from_bytes(bytes), CorruptData);
  const MaskedInput y = h.clients.at(h.id(0)).masked_input(in, h.updates[h.id(0)]);
  expect_rejects_damaged(y);
  auto y_bytes = y.to_bytes();
  y_bytes[52] ^= 1;  // the length (after tag, round, id, commitment) no longer matches
  EXPECT_THROW(MaskedInput::from_bytes(y_bytes), CorruptData);
  h.server->receive(y);
  h.gone = {h.id(0)};
  h.mask();
  h.gone.clear();
  const UnmaskRequest q = h.server->unmask_request();
  expect_rejects_damaged(q);
  const UnmaskResponse a = h.clients.at(h.id(0)).unmask(q);
  expect_rejects_damaged(a);
}

TEST(SecAgg, TrafficMatchesTheDocumentedSizes) {
  const size_t n = 5, m = 100;
  Harness h(n, 3, m);
  h.advertise();
  h.share();
  h.mask();
  h.unmask();
  h.server->result();
  const auto& t = h.server->traffic();
  EXPECT_EQ(t[0].bytes_received, n * 84);
  EXPECT_EQ(t[0].bytes_sent, n * (16 + 72 * n));
  EXPECT_EQ(t[1].bytes_received, n * (24 + 196 * (n - 1)));
  EXPECT_EQ(t[1].bytes_sent, n * (24 + 196 * (n - 1)));
  EXPECT_EQ(t[2].bytes_received, n * (60 + 4 * m));
  EXPECT_EQ(t[3].bytes_sent, n * (20 + 8 * n));
  EXPECT_EQ(t[3].bytes_received, n * (28 + 68 * n));
  for (const auto& r : t) {
    EXPECT_EQ(r.messages_received, n);
    EXPECT_EQ(r.messages_sent, r.bytes_sent ? n : 0);
  }
}

TEST(SecAgg, HundredClientsTenThousandValues) {
  const auto start = std::chrono::steady_clock::now();
  Harness h(100, 51, 10000);
  h.advertise();
  h.gone = {h.id(7)};  // never shares
  h.share();
  h.gone = {h.id(7), h.id(50)};  // shares, then drops: its masks are recovered from s_sk shares
  h.mask();
  h.gone.insert(h.id(99));
  h.unmask();
  const Result& r = h.server->result();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<uint64_t> counted;
  for (size_t k = 0; k < 100; ++k)
    if (k != 7 && k != 50) counted.push_back(h.id(k));
  h.expect_sum(r, counted);
  EXPECT_EQ(r.responders.size(), 97u);
  std::printf("[ secagg   ] 100 clients x 10000 values, all four rounds: %.2f s\n", seconds);
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace krab::federated::secagg
