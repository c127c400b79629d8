// MPI backend tests: one rank per process, started by mpirun (see mpi_tests.cmake).
//
// Every rank runs the same gtest cases on its own MpiCommunicator; rank 0 prints gtest's usual
// report, the other ranks print only their failures, prefixed "[rank r]". All ranks agree on
// the exit code (the worst one), so mpirun fails if any rank failed.
//
// `--hang-test` (2+ ranks) checks the no-silent-hang rule instead: rank 1 never joins an
// allreduce, rank 0 must get krab::Timeout within Options::timeout = 1 s naming the op, its
// sequence number, the rank and the backend, and then ends the whole job with MPI_Abort (rank 1
// would otherwise sit outside the collective forever). It prints "hang-test PASS" on success.
// `--hang-exit-test` is the same hang, but rank 0 then simply returns from main(): the static
// guard must see the pending allreduce and abort the job rather than hang in MPI_Finalize.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "collective_suite.h"
#include "comm/backends/mpi/mpi_communicator.h"
#include "core/errors.h"

namespace krab::comm {
namespace {

using namespace std::chrono_literals;

Communicator* g_comm = nullptr;  // the world group, owned by main()

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Replaces gtest's printer on ranks other than 0: failures only, tagged with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n[rank %d] %s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), rank_, r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

TEST(Mpi, IdentityMatchesTheLauncher) {
  Communicator& c = *g_comm;
  EXPECT_EQ(c.backend(), "mpi");
  EXPECT_EQ(c.generation(), 0);
  EXPECT_TRUE(mpi_launched());
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  ASSERT_NE(size, nullptr);
  ASSERT_NE(rank, nullptr);
  EXPECT_EQ(c.size(), std::atoi(size));
  EXPECT_EQ(c.rank(), std::atoi(rank));
}

TEST(Mpi, CollectiveSuite) { krab::testing::run_collective_suite(*g_comm); }

TEST(Mpi, SixteenBitFloatsReduceThroughKrabOps) {
  Communicator& c = *g_comm;
  const int W = c.size(), r = c.rank();
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    // Small integers and halves are exact in both 16-bit formats.
    auto t = torch::full({33}, r + 1, dtype);
    c.allreduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(t, torch::full({33}, W * (W + 1) / 2, dtype))) << dtype;
    auto m = torch::full({5}, r - 1, dtype);
    c.allreduce(m, ReduceOp::kMax)->wait();
    EXPECT_TRUE(torch::equal(m, torch::full({5}, W - 2, dtype))) << dtype;
    c.allreduce(m, ReduceOp::kMin)->wait();
    EXPECT_TRUE(torch::equal(m, torch::full({5}, W - 2, dtype))) << dtype;
    auto a = torch::full({4}, 2 * r, dtype);
    c.allreduce(a, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(torch::equal(a, torch::full({4}, W - 1, dtype))) << dtype;
    auto in = torch::arange(3 * W, torch::kFloat).to(dtype);
    auto out = torch::empty({3}, dtype);
    c.reduce_scatter(in, out, ReduceOp::kSum)->wait();
    auto expect = (torch::arange(3, torch::kFloat) + 3 * r) * W;
    EXPECT_TRUE(torch::equal(out, expect.to(dtype))) << dtype;
  }
}

TEST(Mpi, IntegerDtypesAndUnsupportedOnes) {
  Communicator& c = *g_comm;
  const int W = c.size(), r = c.rank();
  for (auto dtype : {at::kInt, at::kShort, at::kChar, at::kByte}) {
    auto t = torch::full({9}, r + 1, dtype);
    c.allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t, torch::full({9}, W * (W + 1) / 2, dtype))) << dtype;
  }
  auto flags = torch::ones({4}, torch::kBool);
  EXPECT_THROW(c.allreduce(flags), NotSupported);
  try {
    c.allreduce(flags);
  } catch (const NotSupported& e) {
    EXPECT_TRUE(contains(e.what(), "Bool")) << e.what();
  }
  // Data movement takes any dtype.
  auto b = torch::full({6}, r == 0, torch::kBool);
  c.broadcast(b, 0)->wait();
  EXPECT_TRUE(b.all().item<bool>());
  const auto one_two = torch::full({3}, c10::complex<double>(1, 2), at::kComplexDouble);
  auto z = r == 0 ? one_two.clone() : torch::zeros({3}, at::kComplexDouble);
  c.broadcast(z, 0)->wait();
  EXPECT_TRUE(torch::equal(z, one_two));
}

TEST(Mpi, WorkWaitedOnAnotherThreadWhileTheNextOpStarts) {
  Communicator& c = *g_comm;
  const int W = c.size(), r = c.rank();
  for (int round = 0; round < 20; ++round) {
    auto a = torch::full({4096}, static_cast<float>(r));
    auto b = torch::full({4096}, static_cast<float>(2 * r));
    auto wa = c.allreduce(a);
    std::thread waiter([&] { wa->wait(); });
    auto wb = c.allreduce(b);
    wb->wait();
    waiter.join();
    EXPECT_TRUE(torch::equal(a, torch::full({4096}, W * (W - 1) / 2.0f)));
    EXPECT_TRUE(torch::equal(b, torch::full({4096}, static_cast<float>(W * (W - 1)))));
  }
}

TEST(Mpi, DebugChecksReportShapeMismatch) {
  Options o;
  o.timeout = 10s;
  o.debug_checks = true;
  auto c = make_mpi_communicator(o);  // every rank builds it: collective
  if (c->size() < 2) return;
  auto t = torch::ones({c->rank() == 0 ? 8 : 9});
  try {
    c->allreduce(t)->wait();
    ADD_FAILURE() << "rank " << c->rank() << ": mismatched shapes were not reported";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "collective mismatch at #0")) << e.what();
  }
  // The mismatching op never started, so the group is still in step.
  auto u = torch::ones({8});
  c->allreduce(u)->wait();
  EXPECT_TRUE(torch::equal(u, torch::full({8}, static_cast<float>(c->size()))));
}

TEST(Mpi, GenerationIsTheOneTheGroupWasBuiltAt) {
  Options o;
  o.timeout = 10s;
  auto c = make_mpi_communicator(o, 3);  // every rank builds it: collective
  EXPECT_EQ(c->generation(), 3);
  auto sub = c->split(c->rank() % 2, c->rank());
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->generation(), 3);
}

TEST(Mpi, RecvOfTheWrongLengthIsAnError) {
  Communicator& c = *g_comm;
  if (c.size() < 2 || c.rank() > 1) return;
  if (c.rank() == 0) {
    auto shorter = torch::ones({5});
    c.send(shorter, 1, 4)->wait();
  } else {
    auto t = torch::zeros({7});
    try {
      c.recv(t, 0, 4)->wait();
      ADD_FAILURE() << "a 5-element message filled a 7-element recv silently";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "expected 7 elements")) << e.what();
      EXPECT_TRUE(contains(e.what(), "recv from rank 0 (tag 4)")) << e.what();
    }
  }
}

// ---- --hang-test ----

// `exit_normally`: after the checks, return from main() instead of ending the job here.
int hang_test(Communicator& c, bool exit_normally) {
  if (c.size() < 2) mpi_abort_job(2, "--hang-test needs at least 2 ranks");
  auto t = torch::ones({16});
  c.allreduce(t)->wait();  // #0, everybody
  if (c.rank() != 0) {
    // Never joins #1. Rank 0 ends the job; if it has not within 30 s, fail loudly.
    std::this_thread::sleep_for(30s);
    mpi_abort_job(3, str_cat("hang-test FAILED: rank ", c.rank(), " was never released"));
  }
  std::string failure, message;
  const auto start = std::chrono::steady_clock::now();
  try {
    c.allreduce(t)->wait();  // #1: rank 1 never joins
    failure = "allreduce #1 completed although rank 1 never joined it";
  } catch (const Timeout& e) {
    message = e.what();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const char* part : {"allreduce #1", "on rank 0", "backend mpi", "timed out after 1 s"})
      if (!contains(message, part)) failure += str_cat("message lacks '", part, "'; ");
    if (s < 0.9 || s > 3.0) failure += str_cat("timed out after ", s, " s, expected about 1 s; ");
  } catch (const std::exception& e) {
    failure = str_cat("wrong exception: ", e.what());
  }
  // MPI cannot cancel #1, so the group must refuse further ops instead of mismatching them.
  try {
    c.allreduce(t)->wait();
    failure += "an op after the timeout was accepted; ";
  } catch (const Timeout& e) {
    failure += str_cat("an op after the timeout timed out instead of being refused: ", e.what());
  } catch (const Error& e) {
    if (!contains(e.what(), "unusable")) failure += str_cat("refusal unclear: ", e.what(), "; ");
  }
  if (!failure.empty())
    mpi_abort_job(1, str_cat("hang-test FAILED: ", failure, " [", message, "]"));
  std::printf("hang-test PASS: %s\n", message.c_str());
  std::fflush(stdout);
  if (exit_normally) return 0;  // the static guard has to end the job now
  mpi_abort_job(0, "hang-test: ending the job, rank 1 is still outside allreduce #1");
}

}  // namespace
}  // namespace krab::comm

int main(int argc, char** argv) {
  using namespace krab::comm;
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool hang = mode == "--hang-test" || mode == "--hang-exit-test";
  Options options;
  // Short enough that a suite bug which desynchronises the ranks fails well within ctest's limit.
  options.timeout = hang ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(20000);
  auto comm = make_mpi_communicator(options);
  if (hang) return hang_test(*comm, mode == "--hang-exit-test");

  ::testing::InitGoogleTest(&argc, argv);
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(comm->rank()));
  }
  g_comm = comm.get();
  int rc = RUN_ALL_TESTS();
  try {
    auto worst = torch::full({1}, rc, torch::kInt);
    comm->allreduce(worst, ReduceOp::kMax)->wait();
    rc = worst.item<int>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] could not agree on the exit code: %s\n", comm->rank(),
                 e.what());
    rc = rc ? rc : 1;
  }
  g_comm = nullptr;
  comm.reset();
  return rc;
}
