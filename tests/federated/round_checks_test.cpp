// The server's and the client's checks of a round that a dishonest party could exploit: the
// default bound on a client's example count, a bad share in secure aggregation's unmasking
// round, and a roster larger than the round announced.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "core/errors.h"
#include "federated/rounds.h"
#include "federated/secagg.h"
#include "federated/secure_client.h"
#include "scripted_participant.h"

namespace krab::federated {
namespace {

// The bound is on by default: a job that never mentions it still refuses a client that claims
// more examples than any genuine one holds.
TEST(Rounds, TheDefaultExampleBoundRefusesAClientClaimingMore) {
  FederatedOptions o = FederatedOptions::from_config(core::Config());
  EXPECT_EQ(o.max_client_examples, 1000000);
  o.fraction = 1.0;
  o.min_clients = 2;
  std::vector<std::unique_ptr<Scripted>> c;
  c.push_back(std::make_unique<Scripted>("a", torch::full({4}, 1.f), 60000));
  c.push_back(std::make_unique<Scripted>("b", torch::full({4}, 3.f), 60000));
  c.push_back(std::make_unique<Scripted>("greedy", torch::full({4}, 50.f), 1000001));
  RoundRunner run(o, torch::zeros({4}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok) << rec.failure;
  EXPECT_EQ(rec.counted, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(rec.rejected.size(), 1u);
  EXPECT_EQ(rec.rejected[0].client, "greedy");
  EXPECT_NE(rec.rejected[0].reason.find("federated.max_client_examples (1000000)"),
            std::string::npos)
      << rec.rejected[0].reason;
}

// A client that answers round 3 with a bad share (well-formed, of another value) is set aside
// by name; the sum over the cohort is still exact, and the round goes on.
class BadSharer : public Scripted {
 public:
  using Scripted::Scripted;
  std::vector<uint8_t> secagg(const SecAggRequest& req) override {
    std::vector<uint8_t> out = Scripted::secagg(req);
    if (req.stage != SecAggRequest::kUnmask) return out;
    auto msg = secagg::UnmaskResponse::from_bytes(out);
    msg.self_mask_shares.at(1).share.y.at(0) ^= 1;  // another client's seed, one chunk off
    return msg.to_bytes();
  }
};

TEST(Rounds, ABadUnmaskingShareDropsItsSenderAndTheSumStaysExact) {
  std::vector<at::Tensor> u = {torch::full({16}, 1.f), torch::full({16}, 2.f),
                               torch::full({16}, 3.f), torch::full({16}, 4.f),
                               torch::full({16}, 5.f)};
  std::vector<std::unique_ptr<Scripted>> c;
  // First in the cohort (ids sort): its shares are among the first t the server combines.
  c.push_back(std::make_unique<BadSharer>("bad", u[0], 1));
  for (int i = 1; i < 5; ++i) c.push_back(std::make_unique<Scripted>(str_cat("c", i), u[i], 1));
  FederatedOptions o = all_clients(2);
  o.secure = true;
  o.secagg_threshold = 0.6;  // t = 3 of 5
  RoundRunner run(o, torch::zeros({16}), false);
  const RoundRecord rec = run.run_round(ptrs(c));
  ASSERT_TRUE(rec.ok) << rec.failure;
  // Its masked update was summed in round 2; only its round-3 answer is set aside.
  EXPECT_EQ(rec.counted, (std::vector<std::string>{"bad", "c1", "c2", "c3", "c4"}));
  ASSERT_EQ(rec.dropped.size(), 1u);
  EXPECT_EQ(rec.dropped[0].client, "bad");
  EXPECT_NE(rec.dropped[0].reason.find("round-3 shares"), std::string::npos);
  EXPECT_LT((run.global() - torch::full({16}, 3.f)).abs().max().item<double>(), 1e-5);
}

// The client checks the threshold against the cohort size the round announced (2t > n), so a
// roster with more members than that is refused: t would no longer be a majority of it.
TEST(Rounds, ARosterLargerThanTheAnnouncedCohortIsRefused) {
  FitInstruction ins;
  ins.round = 4;
  ins.secure = true;
  ins.secagg_threshold = 3;
  ins.secagg_clients = 4;  // 2t > n holds for the n announced
  ins.secagg_clip = 1.0;
  ins.secagg_id = 1;
  SecureClient me(ins, torch::zeros({8}));
  secagg::Roster roster;
  roster.round = 4;
  roster.clients.push_back(secagg::AdvertiseKeys::from_bytes(me.advertise()));
  std::vector<std::unique_ptr<secagg::Client>> others;
  for (uint64_t id = 2; id <= 5; ++id) {
    FitInstruction theirs = ins;
    theirs.secagg_id = id;
    others.push_back(std::make_unique<secagg::Client>(id, secagg_config(theirs, 8)));
    roster.clients.push_back(others.back()->advertise_keys());
  }
  SecAggRequest req;
  req.stage = SecAggRequest::kShareKeys;
  req.weight = 0.2;
  req.payload = roster.to_bytes();  // 5 members for a round of 4: 2t = 6 is not > 5
  try {
    me.handle(req);
    ADD_FAILURE() << "a roster of 5 was accepted for a round of 4";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the roster has 5 clients, more than the 4"),
              std::string::npos)
        << e.what();
  }
  roster.clients.pop_back();  // exactly n: accepted (fewer, down to t, is a dropout)
  req.payload = roster.to_bytes();
  EXPECT_NO_THROW(me.handle(req));
}

}  // namespace
}  // namespace krab::federated
