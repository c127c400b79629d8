#include "collective_suite.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/errors.h"

namespace krab::testing {
namespace {

using krab::comm::Communicator;
using krab::comm::OpKind;
using krab::comm::ReduceOp;
using krab::comm::TrafficStats;
using krab::comm::WorkPtr;

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

bool is_float(at::ScalarType t) { return at::isFloatingType(t); }

// Exact for integers; floats only ever hold small integers or halves here, but the average
// divides, so allow rounding.
void expect_same(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const bool same = is_float(actual.scalar_type())
                        ? torch::allclose(actual.to(at::kDouble), expected.to(at::kDouble),
                                          /*rtol=*/1e-6, /*atol=*/1e-6)
                        : torch::equal(actual, expected.to(actual.scalar_type()));
  if (!same) {
    const auto diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs();
    const int64_t at = diff.numel() ? diff.argmax().item<int64_t>() : 0;
    ADD_FAILURE() << what << ": element " << at << " is " << actual.view({-1})[at].item<double>()
                  << ", expected " << expected.view({-1})[at].item<double>();
  }
}

uint64_t sent(const TrafficStats& t, OpKind op) { return t.bytes_sent[static_cast<int>(op)]; }
uint64_t ops(const TrafficStats& t, OpKind op) { return t.ops[static_cast<int>(op)]; }

// (i % 7 + 1) with the sign alternating by element: rank r holds base * (r + 1).
at::Tensor base(int64_t n) {
  auto i = torch::arange(n, torch::kLong);
  return (i.remainder(7) + 1) * (1 - 2 * i.remainder(2));
}

void check_allreduce(Communicator& c) {
  const int W = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
    for (int64_t n : {0, 1, 7, 1000, 65537}) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        if (op == ReduceOp::kAvg && !is_float(dtype)) continue;
        const auto b = base(n).to(at::kDouble);
        at::Tensor t = (b * (r + 1)).to(dtype);
        at::Tensor expected;
        switch (op) {
          case ReduceOp::kSum:
            expected = b * (W * (W + 1) / 2);
            break;
          case ReduceOp::kAvg:
            expected = b * ((W + 1) / 2.0);
            break;
          case ReduceOp::kMax:
            expected = torch::where(b > 0, b * W, b);
            break;
          case ReduceOp::kMin:
            expected = torch::where(b > 0, b, b * W);
            break;
        }
        c.allreduce(t, op)->wait();
        expect_same(t, expected,
                    str_cat("rank ", r, ": allreduce ", reduce_name(op), " ", dtype, "[", n, "]"));
      }
    }
  }
  // 2-D, and several in flight at once, waited on in reverse order.
  std::vector<at::Tensor> ts;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    ts.push_back(torch::full({3, 5}, static_cast<float>((r + 1) * (k + 1))));
    works.push_back(c.allreduce(ts.back(), ReduceOp::kSum));
  }
  for (int k = 3; k >= 0; --k) {
    works[k]->wait();
    EXPECT_TRUE(works[k]->is_completed());
    works[k]->wait();  // waiting again is harmless
    expect_same(ts[k], torch::full({3, 5}, static_cast<float>(W * (W + 1) / 2 * (k + 1))),
                str_cat("rank ", r, ": allreduce #", k, " of four in flight"));
  }
}

void check_allgather(Communicator& c) {
  const int W = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kLong}) {
    for (int64_t n : {0, 1, 7, 1000}) {
      auto in = (torch::arange(n, torch::kLong) + 1000 * r).to(dtype);
      auto out = torch::full({W * n}, -1, dtype);
      c.allgather(in, out)->wait();
      std::vector<at::Tensor> parts;
      for (int q = 0; q < W; ++q) parts.push_back(torch::arange(n, torch::kLong) + 1000 * q);
      expect_same(out, torch::cat(parts), str_cat("rank ", r, ": allgather ", dtype, "[", n, "]"));
    }
  }
  auto in = torch::full({2, 3}, static_cast<float>(r));
  auto out = torch::empty({2 * W, 3});
  c.allgather(in, out)->wait();
  for (int q = 0; q < W; ++q)
    expect_same(out.narrow(0, 2 * q, 2), torch::full({2, 3}, static_cast<float>(q)),
                str_cat("rank ", r, ": allgather 2-D, block of rank ", q));
}

void check_reduce_scatter(Communicator& c) {
  const int W = c.size(), r = c.rank();
  struct Case {
    at::ScalarType dtype;
    ReduceOp op;
  };
  for (Case k : {Case{at::kFloat, ReduceOp::kSum}, Case{at::kLong, ReduceOp::kSum},
                 Case{at::kFloat, ReduceOp::kMax}, Case{at::kDouble, ReduceOp::kAvg}}) {
    for (int64_t n : {0, 1, 7, 1000}) {
      // Element j of rank q's input is (j + 1)(q + 1); rank r keeps chunk r of the reduction.
      auto j = torch::arange(W * n, torch::kLong).to(at::kDouble) + 1;
      auto in = (j * (r + 1)).to(k.dtype);
      auto out = torch::full({n}, -1, k.dtype);
      c.reduce_scatter(in, out, k.op)->wait();
      auto mine = j.narrow(0, r * n, n);
      at::Tensor expected = k.op == ReduceOp::kSum   ? mine * (W * (W + 1) / 2)
                            : k.op == ReduceOp::kMax ? mine * W
                                                     : mine * ((W + 1) / 2.0);
      expect_same(
          out, expected,
          str_cat("rank ", r, ": reduce_scatter ", reduce_name(k.op), " ", k.dtype, "[", n, "]"));
    }
  }
}

void check_alltoall(Communicator& c) {
  const int W = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kLong, at::kByte}) {
    for (int64_t n : {0, 1, 7, 100}) {
      // Chunk j of rank q's input holds q * 10 + j (+ the element index): rank r must receive
      // chunk r of every rank q as its chunk q.
      auto base = torch::arange(n, torch::kLong);
      std::vector<at::Tensor> mine, expected;
      for (int j = 0; j < W; ++j) {
        mine.push_back(base + r * 10 + j);
        expected.push_back(base + j * 10 + r);
      }
      auto in = torch::cat(mine).to(dtype);
      auto out = torch::full({W * n}, 7, dtype);
      c.alltoall(in, out)->wait();
      expect_same(out, torch::cat(expected),
                  str_cat("rank ", r, ": alltoall ", dtype, "[", n, "]"));
    }
  }
}

void check_broadcast(Communicator& c) {
  const int W = c.size(), r = c.rank();
  for (int root = 0; root < W; ++root) {
    for (auto dtype : {at::kFloat, at::kLong}) {
      for (int64_t n : {0, 1, 7, 1000}) {
        auto expected = torch::arange(n, torch::kLong) + 100 * root;
        auto t = r == root ? expected.to(dtype) : torch::full({n}, -1, dtype);
        c.broadcast(t, root)->wait();
        expect_same(t, expected,
                    str_cat("rank ", r, ": broadcast from ", root, " ", dtype, "[", n, "]"));
      }
    }
  }
}

at::Tensor payload(int src, int tag, int64_t n) {
  return torch::arange(n, torch::kLong) + 1000 * src + tag;
}

void check_send_recv(Communicator& c) {
  const int W = c.size(), r = c.rank();
  if (W < 2) return;
  const int next = (r + 1) % W, prev = (r + W - 1) % W;
  for (int64_t n : {7, 1000}) {
    // Receives first, the later tag first: matching is by (source, tag), not by arrival.
    auto in5 = torch::zeros({n}, torch::kLong), in3 = torch::zeros({n}, torch::kLong);
    auto r5 = c.recv(in5, prev, 5);
    auto r3 = c.recv(in3, prev, 3);
    auto out3 = payload(r, 3, n), out5 = payload(r, 5, n);
    auto s3 = c.send(out3, next, 3);
    auto s5 = c.send(out5, next, 5);
    for (auto& w : {s3, s5, r5, r3}) w->wait();
    expect_same(in3, payload(prev, 3, n), str_cat("rank ", r, ": recv tag 3 from ", prev));
    expect_same(in5, payload(prev, 5, n), str_cat("rank ", r, ": recv tag 5 from ", prev));
  }
}

void check_barrier(Communicator& c) {
  for (int k = 0; k < 3; ++k) {
    auto w = c.barrier();
    w->wait();
    EXPECT_TRUE(w->is_completed()) << "rank " << c.rank() << ": barrier " << k;
  }
}

void check_split(Communicator& c) {
  const int W = c.size(), r = c.rank();
  const int parity = r % 2;
  const int half = parity == 0 ? (W + 1) / 2 : W / 2;
  const auto parent_before = c.traffic();

  auto sub = c.split(parity, r);
  EXPECT_NE(sub, nullptr) << "rank " << r;
  if (sub) {
    EXPECT_EQ(sub->size(), half) << "rank " << r;
    EXPECT_EQ(sub->rank(), r / 2) << "rank " << r;
    EXPECT_EQ(sub->generation(), c.generation());
    EXPECT_EQ(sub->backend(), c.backend());
    auto t = torch::full({5}, static_cast<double>(r + 1), torch::kDouble);
    sub->allreduce(t, ReduceOp::kSum)->wait();
    double expect = 0;
    for (int q = parity; q < W; q += 2) expect += q + 1;
    expect_same(t, torch::full({5}, expect, torch::kDouble),
                str_cat("rank ", r, ": allreduce in the ", parity ? "odd" : "even", " half"));
    EXPECT_EQ(ops(sub->traffic(), OpKind::kAllreduce), 1u) << "rank " << r;
  }
  // Sub-groups count their own traffic.
  EXPECT_EQ(ops(c.traffic(), OpKind::kAllreduce), ops(parent_before, OpKind::kAllreduce))
      << "rank " << r << ": the sub-group's allreduce was counted by the parent";

  // Descending keys reverse the order inside each half.
  auto rev = c.split(parity, -r);
  EXPECT_NE(rev, nullptr) << "rank " << r;
  if (rev) {
    EXPECT_EQ(rev->rank(), half - 1 - r / 2) << "rank " << r << ": descending keys";
  }

  // A negative color joins no group; the others form one without it.
  auto rest = c.split(r == 0 ? -1 : 7, r);
  if (r == 0) {
    EXPECT_EQ(rest, nullptr) << "rank 0 passed a negative color";
  } else {
    EXPECT_NE(rest, nullptr) << "rank " << r;
    if (rest) {
      EXPECT_EQ(rest->size(), W - 1);
      EXPECT_EQ(rest->rank(), r - 1);
      auto t = torch::ones({3});
      rest->allreduce(t)->wait();
      expect_same(t, torch::full({3}, static_cast<float>(W - 1)),
                  str_cat("rank ", r, ": allreduce without rank 0"));
    }
  }
}

void check_traffic(Communicator& c) {
  const int W = c.size(), r = c.rank();
  const uint64_t w = static_cast<uint64_t>(W);

  auto before = c.traffic();
  auto t = torch::ones({1 << 16});
  const uint64_t N = t.nbytes();
  c.allreduce(t)->wait();
  auto after = c.traffic();
  EXPECT_EQ(sent(after, OpKind::kAllreduce) - sent(before, OpKind::kAllreduce),
            W > 1 ? 2 * (w - 1) * N / w : 0)
      << "rank " << r << ": allreduce of " << N << " bytes must count 2(W-1)/W*N";
  EXPECT_EQ(ops(after, OpKind::kAllreduce) - ops(before, OpKind::kAllreduce), 1u);
  EXPECT_EQ(after.total_bytes_sent() - before.total_bytes_sent(),
            sent(after, OpKind::kAllreduce) - sent(before, OpKind::kAllreduce));

  before = after;
  auto piece = torch::ones({1000});
  auto all = torch::empty({W * 1000});
  c.allgather(piece, all)->wait();
  after = c.traffic();
  EXPECT_EQ(sent(after, OpKind::kAllgather) - sent(before, OpKind::kAllgather),
            (w - 1) * piece.nbytes())
      << "rank " << r << ": allgather counts (W-1)*n";

  before = after;
  c.reduce_scatter(all, piece)->wait();
  after = c.traffic();
  EXPECT_EQ(sent(after, OpKind::kReduceScatter) - sent(before, OpKind::kReduceScatter),
            (w - 1) * piece.nbytes())
      << "rank " << r << ": reduce_scatter counts (W-1)/W*N";

  before = after;
  auto scattered = torch::empty({W * 1000});
  c.alltoall(all, scattered)->wait();
  after = c.traffic();
  EXPECT_EQ(sent(after, OpKind::kAlltoall) - sent(before, OpKind::kAlltoall),
            (w - 1) * piece.nbytes())
      << "rank " << r << ": alltoall counts (W-1)/W*N";

  before = after;
  c.broadcast(t, 0)->wait();
  after = c.traffic();
  EXPECT_EQ(sent(after, OpKind::kBroadcast) - sent(before, OpKind::kBroadcast),
            r == 0 ? (w - 1) * N : 0)
      << "rank " << r << ": broadcast counts (W-1)*N at the root only";

  if (W < 2) return;
  before = after;
  auto out = torch::ones({100}), in = torch::empty({100});
  auto rw = c.recv(in, (r + W - 1) % W, 9);
  auto sw = c.send(out, (r + 1) % W, 9);
  sw->wait();
  rw->wait();
  after = c.traffic();
  EXPECT_EQ(sent(after, OpKind::kSend) - sent(before, OpKind::kSend), out.nbytes());
  EXPECT_EQ(sent(after, OpKind::kRecv) - sent(before, OpKind::kRecv), 0u);
  EXPECT_EQ(ops(after, OpKind::kRecv) - ops(before, OpKind::kRecv), 1u);
}

// Every op's counted traffic is what comm::wire_bytes() says, the formula a planner uses:
// odd sizes (rounding), empty tensors, every broadcast root, point-to-point and barrier.
void check_wire_bytes(Communicator& c) {
  using krab::comm::wire_bytes;
  const int W = c.size(), r = c.rank();
  // Runs `op` and expects it to add exactly `bytes` and one op of kind `kind`.
  auto expect = [&](OpKind kind, uint64_t bytes, const std::string& what, auto op) {
    const auto before = c.traffic();
    op();
    const auto after = c.traffic();
    EXPECT_EQ(sent(after, kind) - sent(before, kind), bytes)
        << "rank " << r << ": " << what << " counted other than wire_bytes()";
    EXPECT_EQ(after.total_bytes_sent() - before.total_bytes_sent(), bytes) << what;
    EXPECT_EQ(ops(after, kind) - ops(before, kind), 1u) << "rank " << r << ": " << what;
  };
  for (int64_t n : {0, 1, 7, 1001}) {
    const std::string at_n = str_cat("[", n, "]");
    auto t = torch::ones({n}, torch::kDouble);
    expect(OpKind::kAllreduce, wire_bytes(OpKind::kAllreduce, t.nbytes(), W), "allreduce" + at_n,
           [&] { c.allreduce(t)->wait(); });
    auto in = torch::ones({n}, torch::kByte);  // 1-byte items: odd byte counts
    auto gathered = torch::empty({W * n}, torch::kByte);
    expect(OpKind::kAllgather, wire_bytes(OpKind::kAllgather, in.nbytes(), W), "allgather" + at_n,
           [&] { c.allgather(in, gathered)->wait(); });
    auto chunk = torch::empty({n}, torch::kByte);
    expect(OpKind::kReduceScatter, wire_bytes(OpKind::kReduceScatter, gathered.nbytes(), W),
           "reduce_scatter" + at_n, [&] { c.reduce_scatter(gathered, chunk)->wait(); });
    auto scattered = torch::empty({W * n}, torch::kByte);
    expect(OpKind::kAlltoall, wire_bytes(OpKind::kAlltoall, gathered.nbytes(), W),
           "alltoall" + at_n, [&] { c.alltoall(gathered, scattered)->wait(); });
    for (int root = 0; root < W; ++root)
      expect(OpKind::kBroadcast, r == root ? wire_bytes(OpKind::kBroadcast, t.nbytes(), W) : 0,
             str_cat("broadcast from ", root, at_n), [&] { c.broadcast(t, root)->wait(); });
    if (W < 2) continue;
    auto out = torch::ones({n}), back = torch::empty({n});
    WorkPtr rw;
    expect(OpKind::kRecv, wire_bytes(OpKind::kRecv, back.nbytes(), W), "recv" + at_n,
           [&] { rw = c.recv(back, (r + W - 1) % W, 11); });
    expect(OpKind::kSend, wire_bytes(OpKind::kSend, out.nbytes(), W), "send" + at_n,
           [&] { c.send(out, (r + 1) % W, 11)->wait(); });
    rw->wait();
  }
  expect(OpKind::kBarrier, wire_bytes(OpKind::kBarrier, 0, W), "barrier",
         [&] { c.barrier()->wait(); });
}

void check_invalid_arguments(Communicator& c) {
  using krab::InvalidArgument;
  const int W = c.size(), r = c.rank();
  const auto before = c.traffic();

  auto strided = torch::ones({4, 4}).t();
  EXPECT_THROW(c.allreduce(strided), InvalidArgument) << "non-contiguous, rank " << r;
  auto ints = torch::ones({4}, torch::kLong);
  EXPECT_THROW(c.allreduce(ints, ReduceOp::kAvg), InvalidArgument) << "avg of int64";

  auto in = torch::ones({4});
  auto too_big = torch::empty({W * 4 + 1});
  EXPECT_THROW(c.allgather(in, too_big), InvalidArgument) << "allgather output numel";
  auto wrong_dtype = torch::empty({W * 4}, torch::kDouble);
  EXPECT_THROW(c.allgather(in, wrong_dtype), InvalidArgument) << "allgather output dtype";
  EXPECT_THROW(c.allgather(strided, too_big), InvalidArgument) << "allgather non-contiguous";

  auto rs_in = torch::ones({W * 4 + 1});
  auto rs_out = torch::empty({4});
  EXPECT_THROW(c.reduce_scatter(rs_in, rs_out), InvalidArgument) << "reduce_scatter input numel";

  auto a2a_in = torch::ones({W * 4 + 1});
  auto a2a_out = torch::empty({W * 4 + 1});
  if (W > 1) EXPECT_THROW(c.alltoall(a2a_in, a2a_out), InvalidArgument) << "alltoall numel % W";
  auto a2a_short = torch::empty({W * 4});
  EXPECT_THROW(c.alltoall(too_big, a2a_short), InvalidArgument) << "alltoall output numel";

  EXPECT_THROW(c.broadcast(in, -1), InvalidArgument) << "broadcast root -1";
  EXPECT_THROW(c.broadcast(in, W), InvalidArgument) << "broadcast root " << W;
  EXPECT_THROW(c.send(in, W, 0), InvalidArgument) << "send to rank " << W;
  EXPECT_THROW(c.recv(in, -1, 0), InvalidArgument) << "recv from rank -1";

  // The messages name the argument at fault.
  try {
    c.allgather(in, too_big);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("output"), std::string::npos) << e.what();
  }
  try {
    c.broadcast(in, W);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("root"), std::string::npos) << e.what();
  }

  const auto after = c.traffic();
  EXPECT_EQ(after.total_bytes_sent(), before.total_bytes_sent()) << "rejected ops sent bytes";
  EXPECT_EQ(after.ops, before.ops) << "rejected ops were counted";

  // Nothing was started, so the group is still in step.
  auto t = torch::full({8}, static_cast<float>(r + 1));
  c.allreduce(t)->wait();
  expect_same(t, torch::full({8}, static_cast<float>(W * (W + 1) / 2)),
              str_cat("rank ", r, ": allreduce after rejected calls"));
}

}  // namespace

void run_collective_suite(Communicator& comm) {
  SCOPED_TRACE(str_cat("rank ", comm.rank(), " of ", comm.size(), ", backend ", comm.backend()));
  check_allreduce(comm);
  check_allgather(comm);
  check_reduce_scatter(comm);
  check_alltoall(comm);
  check_broadcast(comm);
  check_send_recv(comm);
  check_barrier(comm);
  check_split(comm);
  check_traffic(comm);
  check_wire_bytes(comm);
  check_invalid_arguments(comm);
}

}  // namespace krab::testing
