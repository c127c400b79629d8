// Mirrored parameter-server shards (sync.replicas: 1, sync/replication.h). The expectations:
// the mirror's shard is the primary's bit for bit after every acknowledged call (it replays the
// same records through the same code); a promoted mirror takes a retried push once, refuses a
// late record, and deposes the old primary; and training through a primary that is stopped
// half-way ends where an undisturbed run ends (the shards of both runs sum the same gradients,
// perhaps in another order, hence a float bound rather than equality).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "core/errors.h"
#include "sync/param_server.h"

namespace krab::sync {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kNumel = 777;

enum class Opt { kMomentum, kAdam };

std::shared_ptr<ShardState> make_shard(const at::Tensor& init, int workers, int s, int aggregate,
                                       Opt opt, std::shared_ptr<Journal> journal, bool mirror,
                                       int64_t total_pushes = 0) {
  ShardOptions o;
  o.workers = workers;
  o.max_staleness = s;
  o.aggregate = aggregate;
  o.extrapolate = s != 0;
  o.lr_at = [](int64_t t) { return 0.05 / (1.0 + 0.1 * t); };  // t matters: it is replicated
  o.total_pushes = total_pushes;
  o.journal = std::move(journal);
  o.mirror = mirror;
  return std::make_shared<ShardState>(
      o, init, [opt](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        if (opt == Opt::kAdam)
          return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(1));
        return std::make_unique<torch::optim::SGD>(std::move(p),
                                                   torch::optim::SGDOptions(1).momentum(0.9));
      });
}

at::Tensor init_values() { return torch::sin(torch::arange(kNumel, at::kFloat) * 0.37); }

at::Tensor grad_of(int w, int64_t k) {
  return torch::cos(torch::arange(kNumel, at::kFloat) * (0.011 * (w + 1)) + 0.3 * k);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.numel()) * 4) == 0;
}

// A primary whose records go straight into `mirror` (no network): the replication logic alone.
std::shared_ptr<Replicator> direct_link(std::shared_ptr<ShardState>* mirror) {
  return std::make_shared<Replicator>(
      0,
      [mirror](const std::vector<Record>& batch) {
        for (const Record& r : batch)
          if (!(*mirror)->replay(r)) return Replicator::SendResult::kRefused;
        return Replicator::SendResult::kApplied;
      },
      int64_t{1} << 20);
}

// Two workers pushing in turn without staleness bounds, in groups of K, with Adam and with
// momentum: after every answered call the mirror holds the primary's bits, version and clocks.
TEST(Replication, MirrorHoldsThePrimarysBitsAfterEveryAcknowledgedPush) {
  for (Opt opt : {Opt::kMomentum, Opt::kAdam})
    for (int aggregate : {1, 2}) {
      std::shared_ptr<ShardState> mirror =
          make_shard(init_values(), 2, -1, aggregate, opt, nullptr, true);
      auto link = direct_link(&mirror);
      auto primary = make_shard(init_values(), 2, -1, aggregate, opt, link, false);
      for (int w = 0; w < 2; ++w) primary->step({w, 0}, nullptr);
      for (int64_t k = 0; k < 25; ++k)
        for (int w = 0; w < 2; ++w) {
          const at::Tensor g = grad_of(w, k);
          ShardState::Step s{w, k + 1, g.data_ptr<float>(), kNumel, primary->stats().version};
          const ShardState::Reply r = primary->step(s, nullptr);
          ASSERT_EQ(link->wait_acked(r.seq, 10s), Replicator::Outcome::kAcked);
          ASSERT_TRUE(same_bits(primary->values(), mirror->values()))
              << "optimizer " << static_cast<int>(opt) << " K " << aggregate << " step " << k;
          EXPECT_EQ(mirror->stats().version, primary->stats().version);
          EXPECT_EQ(mirror->stats().workers[w].clock, k + 1);
        }
      EXPECT_EQ(primary->stats().version, aggregate == 1 ? 50 : 25);
      EXPECT_EQ(mirror->stats().replayed_seq, 50);
    }
}

// A promoted mirror: the push the old primary forwarded but never answered comes again from the
// worker and is not applied twice; the next one is; a late record is refused, and the primary
// that sent it learns it is deposed.
TEST(Replication, PromotedMirrorTakesARetryOnceAndDeposesTheOldPrimary) {
  std::shared_ptr<ShardState> mirror =
      make_shard(init_values(), 1, -1, 1, Opt::kMomentum, nullptr, true);
  auto link = direct_link(&mirror);
  auto primary = make_shard(init_values(), 1, -1, 1, Opt::kMomentum, link, false);
  primary->step({0, 0}, nullptr);
  const at::Tensor g1 = grad_of(0, 0), g2 = grad_of(0, 1);
  const auto r1 = primary->step({0, 1, g1.data_ptr<float>(), kNumel, 0}, nullptr);
  ASSERT_EQ(link->wait_acked(r1.seq, 10s), Replicator::Outcome::kAcked);
  const at::Tensor after_one = mirror->values();

  // The worker never saw r1 (the primary died): it sends push 1 to the mirror.
  const auto again = mirror->step({0, 1, g1.data_ptr<float>(), kNumel, 0}, nullptr);
  EXPECT_EQ(again.version, 1);
  EXPECT_TRUE(same_bits(mirror->values(), after_one));
  EXPECT_TRUE(mirror->stats().promoted);
  const auto next = mirror->step({0, 2, g2.data_ptr<float>(), kNumel, 1}, nullptr);
  EXPECT_EQ(next.version, 2);
  EXPECT_EQ(mirror->stats().pushes, 2);

  // The old primary, alive after all, takes another push: the mirror refuses its record.
  const auto late = primary->step({0, 2, g2.data_ptr<float>(), kNumel, 1}, nullptr);
  EXPECT_EQ(link->wait_acked(late.seq, 10s), Replicator::Outcome::kDeposed);
  EXPECT_TRUE(link->deposed());
  EXPECT_EQ(mirror->stats().version, 2);  // not 3
}

TEST(Replication, RecordsOutOfOrderOrDivergedAreCorruptData) {
  auto mirror = make_shard(init_values(), 1, -1, 1, Opt::kMomentum, nullptr, true);
  Record gap;
  gap.seq = 2;
  gap.kind = Record::Kind::kRevive;
  EXPECT_THROW(mirror->replay(gap), CorruptData);
  Record diverged;
  diverged.seq = 1;
  diverged.kind = Record::Kind::kRevive;
  diverged.version = 7;  // the primary claims 7 updates the mirror never saw
  EXPECT_THROW(mirror->replay(diverged), CorruptData);
}

// A mirror that cannot be reached is lost: the primary answers anyway, alone.
TEST(Replication, LostMirrorLeavesThePrimaryAnsweringAlone) {
  auto link = std::make_shared<Replicator>(
      3, [](const std::vector<Record>&) { return Replicator::SendResult::kUnreachable; }, 1 << 20);
  auto primary = make_shard(init_values(), 1, -1, 1, Opt::kMomentum, link, false);
  primary->step({0, 0}, nullptr);
  const at::Tensor g = grad_of(0, 0);
  const auto r = primary->step({0, 1, g.data_ptr<float>(), kNumel, 0}, nullptr);
  EXPECT_EQ(link->wait_acked(r.seq, 10s), Replicator::Outcome::kMirrorLost);
  EXPECT_TRUE(link->mirror_lost());
  EXPECT_FALSE(link->deposed());
}

// Over gRPC on loopback: a primary server forwarding to a mirror server; workers push with
// max_staleness 0 (their calls block on each other, so they run in threads).
struct Cluster {
  std::shared_ptr<ShardState> primary_state, mirror_state;
  std::unique_ptr<ParamServer> primary, mirror;
  std::string primary_address, mirror_address;

  Cluster(int workers, int64_t total_pushes) {
    mirror_state =
        make_shard(init_values(), workers, 0, 1, Opt::kMomentum, nullptr, true, total_pushes);
    mirror = std::make_unique<ParamServer>(mirror_state, 0);
    mirror_address = "127.0.0.1:" + std::to_string(mirror->port());
    auto link = std::make_shared<Replicator>(0, mirror_sender(mirror_address, 20s), kNumel * 4);
    primary_state =
        make_shard(init_values(), workers, 0, 1, Opt::kMomentum, link, false, total_pushes);
    primary = std::make_unique<ParamServer>(primary_state, 0, Access{}, link, 20s);
    primary_address = "127.0.0.1:" + std::to_string(primary->port());
  }
};

// The worker's gradient depends on the parameters it pulled (a quadratic pull towards its own
// target), so a lost or doubled update would change every later step.
at::Tensor grad_at(int w, const at::Tensor& params) {
  return params - (torch::arange(kNumel, at::kFloat) * 0.001 + 0.1 * w);
}

struct WorkerResult {
  int steps = 0, failovers = 0;
  std::string failure;
};

// Worker w trains until a reply says stop; `on_step` runs after each of its answered pushes.
void run_worker(const Cluster& c, int w, WorkerResult& out,
                const std::function<void(int, int)>& on_step = nullptr) {
  try {
    PsClient client({c.primary_address}, w, kNumel, 20s, "", {c.mirror_address});
    at::Tensor params = at::empty({kNumel}, at::kFloat);
    PullResult p = client.pull(params);
    while (!p.stop) {
      p = client.push_pull(grad_at(w, params), params);
      ++out.steps;
      if (on_step) on_step(w, out.steps);
    }
    client.leave({});
    out.failovers = client.failovers();
  } catch (const std::exception& e) {
    out.failure = e.what();
  }
}

TEST(Replication, OverGrpcTheMirrorEqualsThePrimaryBitForBit) {
  constexpr int kWorkers = 3, kSteps = 12;
  Cluster c(kWorkers, kWorkers * kSteps);
  std::vector<WorkerResult> results(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) threads.emplace_back([&, w] { run_worker(c, w, results[w]); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    EXPECT_EQ(r.failure, "");
    EXPECT_EQ(r.failovers, 0);
  }
  const ShardSnapshot p = snapshot_shard(c.primary_address, 10s);
  const ShardSnapshot m = snapshot_shard(c.mirror_address, 10s);
  EXPECT_EQ(p.version, kSteps);
  EXPECT_EQ(m.version, kSteps);
  EXPECT_EQ(m.pushes, kWorkers * kSteps);
  EXPECT_EQ(m.clocks, p.clocks);
  EXPECT_TRUE(m.mirror);
  EXPECT_FALSE(m.promoted);
  EXPECT_TRUE(same_bits(p.values, m.values));
}

// The primary server stops (in process: its gRPC server shuts down, cancelling what is in
// flight) once worker 0 has 5 answered steps; the workers go on with the mirror, and the run
// ends with every round applied once: the parameters of an undisturbed run, up to the order
// in which a round's three gradients were summed (float rounding, far below 1e-5).
TEST(Replication, WorkersFailOverToTheMirrorAndLoseNoUpdate) {
  constexpr int kWorkers = 3, kSteps = 12;
  Cluster calm(kWorkers, kWorkers * kSteps);
  {
    std::vector<WorkerResult> results(kWorkers);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w)
      threads.emplace_back([&, w] { run_worker(calm, w, results[w]); });
    for (auto& t : threads) t.join();
    for (const auto& r : results) ASSERT_EQ(r.failure, "");
  }
  const at::Tensor expected = calm.primary_state->values();

  Cluster hit(kWorkers, kWorkers * kSteps);
  std::mutex mu;
  std::condition_variable cv;
  bool stop_primary = false;
  std::thread killer([&] {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return stop_primary; }));
    lock.unlock();
    hit.primary.reset();
  });
  std::vector<WorkerResult> results(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w)
    threads.emplace_back([&, w] {
      run_worker(hit, w, results[w], [&](int who, int steps) {
        if (who != 0 || steps != 5) return;
        std::lock_guard<std::mutex> lock(mu);
        stop_primary = true;
        cv.notify_all();
      });
    });
  for (auto& t : threads) t.join();
  killer.join();
  int failovers = 0;
  for (const auto& r : results) {
    EXPECT_EQ(r.failure, "");
    failovers += r.failovers;
  }
  EXPECT_EQ(failovers, kWorkers);  // every worker now talks to the mirror
  const ShardStats st = hit.mirror_state->stats();
  EXPECT_TRUE(st.promoted);
  EXPECT_EQ(st.version, kSteps);            // every round applied once
  EXPECT_EQ(st.pushes, kWorkers * kSteps);  // no push lost or doubled
  EXPECT_EQ(st.dropped, 0);
  const double diff = (hit.mirror_state->values() - expected).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5);
  std::printf("max |failed over - undisturbed| = %.3g over %lld parameters\n", diff,
              static_cast<long long>(kNumel));
}

}  // namespace
}  // namespace krab::sync
