// The launcher as the keeper of an elastic run on one node (cli/launcher.h, ElasticLaunch):
// spawn_and_supervise starts real processes — this test binary again, which turns into a fake
// worker before main() when KRAB_FAKE_ELASTIC_WORKER is set — and the test kills them the way
// a user or the OOM killer would, reading the pids from RUN_DIR/workers.json.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/launcher.h"
#include "comm/store.h"
#include "core/errors.h"
#include "core/fs.h"
#include "elastic/membership_view.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The fake worker: writes its KRAB_MEMBER_ID to DIR/member-<RANK>, then waits for DIR/finish
// and exits 0; the rank named by KRAB_FAKE_EXIT2_RANK exits 2 at once (bad input).
[[noreturn]] void fake_worker(const std::string& dir) {
  const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "?";
  const char* member = std::getenv("KRAB_MEMBER_ID");
  std::ofstream(dir + "/member-" + rank) << (member ? member : "none");
  const char* exit2 = std::getenv("KRAB_FAKE_EXIT2_RANK");
  if (exit2 && rank == exit2) std::_Exit(2);
  for (int i = 0; i < 3000 && !fs::exists(dir + "/finish"); ++i) ::usleep(10000);
  std::_Exit(fs::exists(dir + "/finish") ? 0 : 3);
}

const bool kFakeWorker = [] {
  const char* dir = std::getenv("KRAB_FAKE_ELASTIC_WORKER");
  if (dir && std::getenv("KRAB_WORKER")) fake_worker(dir);
  return false;
}();

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

class ElasticLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "krab-elaunch-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    ::setenv("KRAB_FAKE_ELASTIC_WORKER", dir_.c_str(), 1);
    control_ = {"127.0.0.1", 0, dir_ + "/store", kSecret};
    server_ = std::make_unique<krab::comm::StoreServer>(control_);  // as host_rendezvous does
    plan_.world_size = plan_.nproc_per_node = plan_.local_world_size = 3;
    plan_.rendezvous = control_;
    krab::cli::ElasticLaunch e;
    e.keeper.dead_after_ms = 60000;  // the fake workers do not beat
    e.store_dir = dir_;
    e.run_dir = dir_ + "/run";
    plan_.elastic = e;
  }
  void TearDown() override {
    if (supervisor_.joinable()) finish();  // a failed assertion left the run going
    ::unsetenv("KRAB_FAKE_ELASTIC_WORKER");
    ::unsetenv("KRAB_FAKE_EXIT2_RANK");
    server_.reset();
    fs::remove_all(dir_);
  }
  void start() {
    supervisor_ =
        std::thread([this] { code_ = krab::cli::spawn_and_supervise(plan_, {"fake"}, 1.0); });
  }
  int finish() {
    std::ofstream(dir_ + "/finish") << "";
    supervisor_.join();
    return code_;
  }
  // workers.json once its generation is `g` (waits up to 10 s).
  nlohmann::json workers(int g) {
    const std::string path = dir_ + "/run/workers.json";
    for (int i = 0; i < 1000; ++i) {
      if (fs::exists(path)) {
        auto j = nlohmann::json::parse(krab::core::read_file(path));
        if (j["generation"] == g) return j;
      }
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "workers.json never reached generation " << g;
    return nlohmann::json::object();
  }

  // Until every fake worker has started (written its member file), up to 10 s.
  void wait_started() {
    for (int i = 0; i < 1000; ++i) {
      if (fs::exists(dir_ + "/member-0") && fs::exists(dir_ + "/member-1") &&
          fs::exists(dir_ + "/member-2"))
        return;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "the fake workers did not start";
  }

  std::string dir_;
  krab::comm::Endpoint control_;
  std::unique_ptr<krab::comm::StoreServer> server_;
  krab::cli::LaunchPlan plan_;
  std::thread supervisor_;
  int code_ = -1;
};

TEST_F(ElasticLaunch, KilledWorkerMakesGenerationOneAndTheRunGoesOn) {
  start();
  const auto g0 = workers(0);
  ASSERT_EQ(g0["workers"].size(), 3u) << g0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g0["workers"][r]["rank"], r);
    EXPECT_EQ(g0["workers"][r]["member"], krab::str_cat("0.", r, ".0"));
  }
  const int64_t killed = g0["workers"][1]["pid"], last = g0["workers"][2]["pid"];
  wait_started();
  ASSERT_EQ(::kill(static_cast<pid_t>(killed), SIGKILL), 0);
  const auto g1 = workers(1);
  ASSERT_EQ(g1["workers"].size(), 2u) << g1;
  EXPECT_EQ(g1["workers"][0]["member"], "0.0.0");
  EXPECT_EQ(g1["workers"][1]["member"], "0.2.0");
  EXPECT_EQ(g1["workers"][1]["pid"], last);
  // The record the workers read: the survivors, a fresh store file, the loss and its cause.
  auto store = krab::comm::connect_store(control_, 5s);
  const auto record = krab::elastic::read_record(*store, 1);
  EXPECT_EQ(record.store, "file " + dir_ + "/g1.store");
  EXPECT_TRUE(fs::exists(dir_ + "/g1.store"));
  EXPECT_EQ(record.kind, krab::elastic::RecordKind::kAbort);
  ASSERT_EQ(record.lost.size(), 1u);
  EXPECT_EQ(record.lost[0].id.str(), "0.1.0");
  EXPECT_EQ(record.lost[0].cause, "killed by signal 9");
  // The survivors still run: the launcher did not stop them.
  EXPECT_EQ(::kill(static_cast<pid_t>(last), 0), 0);
  EXPECT_EQ(finish(), 0);  // every member of generation 1 exited 0
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(krab::core::read_file(krab::str_cat(dir_, "/member-", r)),
              krab::str_cat("0.", r, ".0"));
}

// Below elastic.min_workers for elastic.wait_s: the keeper writes a stop record; the member left
// exits (here 0, as if after its checkpoint) and the launcher says so and exits 1.
TEST_F(ElasticLaunch, BelowMinWorkersForWaitSStopsWithOne) {
  plan_.elastic->keeper.min_workers = 2;
  plan_.elastic->keeper.wait_s = 0.3;
  start();
  const auto g0 = workers(0);
  ASSERT_EQ(g0["workers"].size(), 3u) << g0;
  wait_started();
  for (int r : {1, 2}) ::kill(static_cast<pid_t>(g0["workers"][r]["pid"].get<int64_t>()), SIGKILL);
  // The two exits may be judged in one poll or in two: generations 1-2 or 1-3 end in a stop.
  auto store = krab::comm::connect_store(control_, 5s);
  int64_t stop = -1;
  for (int i = 0; i < 1000 && stop < 0; ++i) {
    const int64_t g = krab::elastic::current_generation(*store);
    if (g > 0 && krab::elastic::read_record(*store, g).state == krab::elastic::RecordState::kStop)
      stop = g;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(stop, 2) << "no stop record";
  EXPECT_EQ(krab::elastic::read_record(*store, stop).workers(), 1);
  EXPECT_EQ(krab::elastic::read_record(*store, stop - 1).state,
            krab::elastic::RecordState::kWaiting);
  EXPECT_EQ(workers(static_cast<int>(stop))["workers"].size(), 1u);
  testing::internal::CaptureStderr();
  EXPECT_EQ(finish(), 1);
  EXPECT_NE(testing::internal::GetCapturedStderr().find(
                krab::str_cat("elastic.min_workers 2: 1 worker(s) left (rank 0 of generation ",
                              stop, ") after waiting elastic.wait_s 0.3 s")),
            std::string::npos);
}

TEST_F(ElasticLaunch, NoWorkerLeftIsExitOne) {
  start();
  const auto g0 = workers(0);
  ASSERT_EQ(g0["workers"].size(), 3u) << g0;
  for (const auto& w : g0["workers"]) ::kill(static_cast<pid_t>(w["pid"].get<int64_t>()), SIGKILL);
  supervisor_.join();
  EXPECT_EQ(code_, 1);
}

TEST_F(ElasticLaunch, BadInputStillStopsEverythingWithTwo) {
  ::setenv("KRAB_FAKE_EXIT2_RANK", "1", 1);
  start();
  supervisor_.join();  // the others are stopped (SIGTERM) without the finish file
  EXPECT_EQ(code_, 2);
}

}  // namespace
