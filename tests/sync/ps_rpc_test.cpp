// The parameter server over gRPC on loopback (sync/param_server.h): two shards, two workers.
// Sync through the server (max_staleness 0) must give exactly SGD on the averaged gradients;
// the byte meters of both sides must agree; failures come back as the exceptions the CLI maps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/errors.h"
#include "sync/param_server.h"

namespace krab::sync {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kNumel = 1001;  // odd: the shards differ in size

std::shared_ptr<ShardState> make_shard(const at::Tensor& full, int shard, int servers, int workers,
                                       int s) {
  ShardOptions o;
  o.workers = workers;
  o.max_staleness = s;
  o.lr_at = [](int64_t) { return 0.05; };
  o.issue_tickets = shard == 0;
  const ShardRange r = shard_range(full.numel(), shard, servers);
  return std::make_shared<ShardState>(
      o, full.narrow(0, r.offset, r.numel).contiguous(),
      [](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<torch::optim::SGD>(std::move(p),
                                                   torch::optim::SGDOptions(1).momentum(0.9));
      });
}

at::Tensor grad_of(int w, int64_t k) {
  return torch::cos(torch::arange(kNumel, at::kFloat) * (0.013 * (w + 1)) + 0.7 * k);
}

std::string local(int port) { return "127.0.0.1:" + std::to_string(port); }

// SGD with momentum on the two workers' averaged gradients: the parameters before each of the
// K steps, then after the last.
std::vector<at::Tensor> sgd_on_the_average(const at::Tensor& x0, int K) {
  at::Tensor ref = x0.clone().set_requires_grad(true);
  torch::optim::SGD opt({ref}, torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<at::Tensor> expected{x0.clone()};
  for (int k = 0; k < K; ++k) {
    ref.mutable_grad() = (grad_of(0, k) + grad_of(1, k)) / 2;
    opt.step();
    expected.push_back(ref.detach().clone());
  }
  return expected;
}

// What one worker saw of the servers.
struct WorkerRun {
  std::vector<at::Tensor> seen;  // the parameters it computed each step from
  std::vector<int64_t> tickets;
  uint64_t sent = 0, received = 0;
  std::string failure;  // what it threw, if anything
};

// Worker w's K steps through PsClient; it leaves with a summary on its last push.
void run_ps_worker(const std::vector<std::string>& addresses, int w, int K, WorkerRun& out) {
  try {
    PsClient client(addresses, w, kNumel, 20000ms);
    at::Tensor params = at::empty({kNumel}, at::kFloat);
    out.tickets.push_back(client.pull(params).ticket);
    out.seen.push_back(params.clone());
    for (int k = 0; k < K - 1; ++k) {
      out.tickets.push_back(client.push_pull(grad_of(w, k), params).ticket);
      out.seen.push_back(params.clone());
    }
    WorkerSummary summary;
    summary.steps = K;
    summary.final_loss = 0.25 * (w + 1);
    summary.evals.push_back({K, 1.5, 0.75, 0.125});  // train.metric loss travels too
    client.push_and_leave(grad_of(w, K - 1), summary);
    out.sent = client.bytes_sent();
    out.received = client.bytes_received();
  } catch (const std::exception& e) {
    out.failure = e.what();
  }
}

TEST(ParamServerRpc, SyncThroughTwoShardsEqualsSgdOnTheAverage) {
  const int W = 2, K = 5;
  const at::Tensor x0 = torch::linspace(-2, 2, kNumel);
  std::vector<std::shared_ptr<ShardState>> shards;
  std::vector<std::unique_ptr<ParamServer>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    shards.push_back(make_shard(x0, i, 2, W, 0));
    servers.push_back(std::make_unique<ParamServer>(shards.back(), 0));
    addresses.push_back(local(servers.back()->port()));
  }

  const std::vector<at::Tensor> expected = sgd_on_the_average(x0, K);

  std::vector<WorkerRun> runs(W);
  std::vector<std::thread> workers;
  for (int w = 0; w < W; ++w)
    workers.emplace_back([&, w] { run_ps_worker(addresses, w, K, runs[w]); });
  for (auto& t : workers) t.join();
  for (int w = 0; w < W; ++w) ASSERT_EQ(runs[w].failure, "") << "worker " << w;

  for (int w = 0; w < W; ++w)
    for (int k = 0; k < K; ++k)
      EXPECT_TRUE(torch::allclose(runs[w].seen[k], expected[k], 1e-6, 1e-6))
          << "worker " << w << " step " << k;
  // Server 0 hands out the data: step k's tickets are k*W .. k*W + W - 1, one per worker.
  for (int k = 0; k < K; ++k) {
    std::vector<int64_t> got{runs[0].tickets[k], runs[1].tickets[k]};
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, (std::vector<int64_t>{k * W, k * W + 1})) << "step " << k;
  }

  // The chief's view: Finish on each shard returns its values and its counters.
  at::Tensor final_model = at::empty({kNumel}, at::kFloat);
  uint64_t server_received = 0, server_sent = 0;
  for (int i = 0; i < 2; ++i) {
    const FinalShard f = finish_shard(addresses[i], 10000ms);
    const ShardRange r = shard_range(kNumel, i, 2);
    final_model.narrow(0, r.offset, r.numel).copy_(f.values);
    EXPECT_EQ(f.version, K);
    server_received += f.bytes_received;
    server_sent += f.bytes_sent;
  }
  EXPECT_TRUE(torch::allclose(final_model, expected[K], 1e-6, 1e-6));
  EXPECT_EQ(server_received, runs[0].sent + runs[1].sent);
  EXPECT_EQ(server_sent, runs[0].received + runs[1].received);
  // At least the gradients up and the parameters down: 4 bytes per value each way per step.
  EXPECT_GE(server_received, static_cast<uint64_t>(W * K * kNumel * 4));
  EXPECT_GE(server_sent, static_cast<uint64_t>(W * K * kNumel * 4));
  EXPECT_LE(server_received, static_cast<uint64_t>(W * K * kNumel * 4 * 1.05));

  // Worker 1's summary reached server 0 only.
  const ShardStats st0 = shards[0]->stats(), st1 = shards[1]->stats();
  EXPECT_EQ(st0.workers[1].summary.steps, K);
  EXPECT_DOUBLE_EQ(st0.workers[1].summary.final_loss, 0.5);
  ASSERT_EQ(st0.workers[1].summary.evals.size(), 1u);
  EXPECT_DOUBLE_EQ(st0.workers[1].summary.evals[0].test_accuracy, 0.75);
  EXPECT_DOUBLE_EQ(st0.workers[1].summary.evals[0].test_loss, 0.125);
  EXPECT_EQ(st1.workers[1].summary.steps, 0);
}

TEST(ParamServerRpc, GradientOfTheWrongSizeIsRefusedByTheServer) {
  const at::Tensor x0 = torch::zeros({kNumel});
  auto shard = make_shard(x0, 0, 1, 1, -1);
  ParamServer server(shard, 0);
  PsClient client({local(server.port())}, 0, kNumel + 2, 10000ms);
  at::Tensor params = at::empty({kNumel + 2}, at::kFloat);
  try {
    client.push_pull(torch::ones({kNumel + 2}), params);
    ADD_FAILURE() << "the server took a gradient of the wrong size";
  } catch (const InvalidArgument& e) {
    // The server's log has the sizes; the reply names none of the shard's state (issue 17).
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter server 0"), std::string::npos) << m;
    EXPECT_NE(m.find("refused"), std::string::npos) << m;
    EXPECT_EQ(m.find("1001"), std::string::npos) << m;
  }
  EXPECT_EQ(shard->stats().pushes, 0);
}

// Issue 17: with no credentials a client pulled every parameter, pushed a NaN gradient (the
// parameters became NaN) and made a server exit with Finish. Now every call needs the job
// secret, whatever it asks for.
TEST(ParamServerRpc, CallsWithoutTheJobSecretAreRefused) {
  const std::string secret(64, 'k');
  auto shard = make_shard(torch::zeros({kNumel}), 0, 1, 1, -1);
  ParamServer server(shard, 0, Access{"127.0.0.1", secret});
  at::Tensor params = at::empty({kNumel}, at::kFloat);
  for (const std::string& wrong : {std::string(), std::string(64, 'x'), secret + "x"}) {
    PsClient outsider({local(server.port())}, 0, kNumel, 10000ms, wrong);
    try {
      outsider.pull(params);
      ADD_FAILURE() << "a pull without the job secret was answered";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("job secret"), std::string::npos) << e.what();
    }
    PsClient pusher({local(server.port())}, 0, kNumel, 10000ms, wrong);
    EXPECT_THROW(pusher.push_pull(torch::full({kNumel}, NAN), params), InvalidArgument);
    EXPECT_THROW(finish_shard(local(server.port()), 2000ms, wrong), InvalidArgument);
  }
  EXPECT_FALSE(server.wait_finish_answered(10ms));
  EXPECT_EQ(shard->stats().pushes, 0);
  EXPECT_TRUE(torch::equal(shard->values(), torch::zeros({kNumel})));
  // The job's own worker is served.
  PsClient worker({local(server.port())}, 0, kNumel, 10000ms, secret);
  worker.pull(params);
  worker.push_pull(torch::ones({kNumel}), params);
  EXPECT_EQ(shard->stats().pushes, 1);
}

TEST(ParamServerRpc, NonFiniteGradientsAreRefused) {
  const std::string secret(64, 'k');
  auto shard = make_shard(torch::zeros({kNumel}), 0, 1, 1, -1);
  ParamServer server(shard, 0, Access{"127.0.0.1", secret});
  at::Tensor params = at::empty({kNumel}, at::kFloat);
  PsClient worker({local(server.port())}, 0, kNumel, 10000ms, secret);
  worker.pull(params);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    at::Tensor g = torch::ones({kNumel});
    g[kNumel / 2] = bad;
    PsClient again({local(server.port())}, 0, kNumel, 10000ms, secret);
    try {
      again.push_pull(g, params);
      ADD_FAILURE() << "a gradient with " << bad << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("NaN or an infinity"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(shard->stats().pushes, 0);
  EXPECT_TRUE(torch::isfinite(shard->values()).all().item<bool>());
}

// shard.cpp's refusals named the worker's clock and the shard's version; a caller now learns
// that it was refused, the server's stderr why.
TEST(ParamServerRpc, RefusalsNameNoStateOfTheShard) {
  auto shard = make_shard(torch::zeros({kNumel}), 0, 1, 2, 1);
  ParamServer server(shard, 0);
  at::Tensor params = at::empty({kNumel}, at::kFloat);
  PsClient w0({local(server.port())}, 0, kNumel, 10000ms);
  w0.pull(params);
  w0.push_pull(torch::ones({kNumel}), params);
  PsClient w1({local(server.port())}, 1, kNumel, 10000ms);
  w1.pull(params);
  w1.push_pull(torch::ones({kNumel}), params);  // clock 1; the shard's version moves on
  PsClient replay({local(server.port())}, 1, kNumel, 10000ms);  // clock 1 again
  try {
    replay.push_pull(torch::ones({kNumel}), params);
    ADD_FAILURE() << "a repeated clock was taken";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("clock"), std::string::npos) << m;
    EXPECT_EQ(m.find("version"), std::string::npos) << m;
    EXPECT_EQ(m.find("worker"), std::string::npos) << m;
  }
}

TEST(ParamServerRpc, WorkerOutOfRangeIsRefused) {
  auto shard = make_shard(torch::zeros({kNumel}), 0, 1, 2, -1);
  ParamServer server(shard, 0);
  PsClient client({local(server.port())}, 5, kNumel, 10000ms);
  at::Tensor params = at::empty({kNumel}, at::kFloat);
  EXPECT_THROW(client.pull(params), InvalidArgument);
}

TEST(ParamServerRpc, ServerGoneIsPeerLost) {
  auto shard = make_shard(torch::zeros({kNumel}), 0, 1, 1, -1);
  auto server = std::make_unique<ParamServer>(shard, 0);
  const std::string address = local(server->port());
  PsClient client({address}, 0, kNumel, 10000ms);
  at::Tensor params = at::empty({kNumel}, at::kFloat);
  client.pull(params);
  server.reset();
  try {
    client.push_pull(torch::ones({kNumel}), params);
    ADD_FAILURE() << "a call to a stopped server succeeded";
  } catch (const PeerLost& e) {
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
}

TEST(ParamServerRpc, PortInUseIsRefused) {
  auto shard = make_shard(torch::zeros({8}), 0, 1, 1, -1);
  ParamServer first(shard, 0);
  EXPECT_THROW(ParamServer(shard, first.port()), InvalidArgument);
}

TEST(ParamServerRpc, ShardTooLargeForOneMessageNamesTheKey) {
  try {
    check_shard_fits(int64_t{1} << 30, 1);  // 4 GiB in one message
    ADD_FAILURE() << "a 4 GiB shard was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sync.servers"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_shard_fits(int64_t{1} << 30, 4));
  EXPECT_THROW(check_shard_fits(100, 0), InvalidArgument);
}

// What fuzz_ps_payload feeds the chief (tests/fuzz/): a Finish reply whose values are not whole
// float32s used to be copied in full into a tensor of size / 4 floats, past its end.
TEST(ParamServerPayload, AFinishReplyOfPartFloatsIsCorruptDataNotAnOverflow) {
  // FinishReply{values: 5 bytes, version: 2}
  try {
    decode_finish_reply(std::string("\x0a\x05"
                                    "abcde"
                                    "\x20\x02",
                                    9),
                        "parameter server 1");
    ADD_FAILURE() << "accepted";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("parameter server 1"), std::string::npos) << e.what();
  }
  const FinalShard f =
      decode_finish_reply(std::string("\x0a\x04\0\0\x80\x3f\x20\x02", 8), "server 0");
  EXPECT_TRUE(torch::equal(f.values, torch::ones({1})));
  EXPECT_EQ(f.version, 2);
}

TEST(ParamServerPayload, AStepRequestGoesThroughTheHandlersChecks) {
  auto shard = make_shard(torch::zeros({2}), 0, 1, 1, -1);
  const auto never = [] { return false; };
  EXPECT_THROW(serve_step(*shard, "\xff\xff", never), CorruptData);
  // StepRequest{worker: 0, clock: 1, grad: 6 bytes}
  EXPECT_THROW(serve_step(*shard,
                          std::string("\x08\x00\x10\x01\x1a\x06"
                                      "abcdef",
                                      12),
                          never),
               InvalidArgument);
}

}  // namespace
}  // namespace krab::sync
