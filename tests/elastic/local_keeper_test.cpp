// The one-machine keeper's adapter (elastic/local_keeper.h) on a real c10d FileStore in a
// private temporary directory, hosted as the launcher hosts it (under a job secret), with
// heartbeats written the way comm::PeerMonitor writes them and a clock the test controls.
#include "elastic/local_keeper.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "core/errors.h"
#include "elastic/membership_view.h"

namespace krab::elastic {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

Instant at(int64_t ms) { return {ms, 1765000000000 + ms}; }

// The launcher's private directory with the job's control FileStore in it.
struct Job {
  fs::path dir;
  std::unique_ptr<comm::StoreServer> server;
  Job() {
    std::string templ = (fs::temp_directory_path() / "krab-keeper-XXXXXX").string();
    KRAB_CHECK(::mkdtemp(templ.data()) != nullptr, "mkdtemp");
    dir = templ;
    server = std::make_unique<comm::StoreServer>(control());
  }
  ~Job() {
    server.reset();
    fs::remove_all(dir);
  }
  comm::Endpoint control() const { return {"127.0.0.1", 0, (dir / "store").string(), kSecret}; }
  // A worker's client of the control store (KRAB_STORE_FILE + KRAB_JOB_SECRET).
  comm::StorePtr worker_client() const { return comm::connect_store(control(), 5s); }
  // What a worker's PeerMonitor does in generation g's group: "hb/<rank>" under "g<g>/" in
  // the generation's store file.
  void beat(int64_t g, const std::string& file, int rank, int64_t beat) const {
    comm::Endpoint e = control();
    e.file = file;
    auto store = comm::prefixed(str_cat("g", g, "/"), comm::connect_store(e, 5s));
    const std::string r = str_cat(beat, " 0 allreduce");
    store->set(str_cat("hb/", rank), std::vector<uint8_t>(r.begin(), r.end()));
  }
  void put(const std::string& key, const std::string& value) const {
    worker_client()->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  LocalKeeperOptions options(std::chrono::milliseconds grace = 0ms) const {
    LocalKeeperOptions o;
    o.keeper.heartbeat_ms = 200;
    o.keeper.dead_after_ms = 3000;
    o.control = control();
    o.store_dir = dir.string();
    o.start_grace = grace;
    return o;
  }
};

std::vector<Member> three() {
  std::vector<Member> m;
  for (int s = 0; s < 3; ++s) m.push_back({0, 0, s, 100 + s, {0, s, 0}});
  return m;
}

std::vector<std::string> ids(const GenerationRecord& r) {
  std::vector<std::string> out;
  for (const Member& m : r.members) out.push_back(str_cat(m.rank, ":", m.id.str()));
  return out;
}

TEST(LocalKeeper, PublishesGenerationZeroWhereWorkersReadIt) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  auto client = job.worker_client();
  ASSERT_EQ(current_generation(*client), 0);
  const GenerationRecord r = read_record(*client, 0);
  EXPECT_EQ(ids(r), (std::vector<std::string>{"0:0.0.0", "1:0.1.0", "2:0.2.0"}));
  EXPECT_EQ(r.members[2].pid, 102);
  EXPECT_EQ(r.store, "file " + job.control().file);
  EXPECT_EQ(r.reason, "start");
  EXPECT_EQ(r.kind, RecordKind::kProposal);
  EXPECT_EQ(r.state, RecordState::kRun);
  EXPECT_EQ(r, keeper.current());
  // Under the job secret's prefix: a client without the secret finds nothing.
  comm::Endpoint bare = job.control();
  bare.secret = "";
  EXPECT_EQ(current_generation(*comm::connect_store(bare, 5s)), -1);
}

TEST(LocalKeeper, KilledWorkerMakesTheNextGenerationInAFreshStoreFile) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  job.put("elastic/progress", "7 1765000000.5");
  keeper.on_child_exit({0, 1, 0}, 0, 9);
  const auto r = keeper.poll(at(40));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->generation, 1);
  EXPECT_EQ(ids(*r), (std::vector<std::string>{"0:0.0.0", "1:0.2.0"}));
  const std::string file = (job.dir / "g1.store").string();
  EXPECT_EQ(r->store, "file " + file);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0) << "the record names a file that is not there";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(r->kind, RecordKind::kAbort);
  EXPECT_EQ(r->reason, "death");
  ASSERT_EQ(r->lost.size(), 1u);
  EXPECT_EQ(r->lost[0], (LostMember{{0, 1, 0}, "killed by signal 9"}));
  EXPECT_EQ(r->decided_step, 7);
  EXPECT_EQ(r->decided_at_ms, at(40).unix_ms);
  auto client = job.worker_client();
  EXPECT_EQ(current_generation(*client), 1);
  EXPECT_EQ(read_record(*client, 1), *r);
  EXPECT_EQ(keeper.current(), *r);
  EXPECT_EQ(describe_change(read_record(*client, 0), *r, job.options().keeper),
            "generation 1: lost rank 1 (member 0.1.0: killed by signal 9); 2 workers go on");
}

TEST(LocalKeeper, ExitZeroIsNotADeath) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  keeper.on_child_exit({0, 2, 0}, 0, 0);
  // The others beat; the member that exited 0 never beats again and is never dropped.
  for (int64_t t = 0; t <= 6000; t += 500) {
    job.beat(0, job.control().file, 0, t + 1);
    job.beat(0, job.control().file, 1, t + 1);
    EXPECT_FALSE(keeper.poll(at(t)).has_value()) << "at " << t << " ms";
  }
  EXPECT_EQ(keeper.current().generation, 0);
}

// A member whose beat stops is dropped exactly dead_after_ms after the last poll that saw it
// move: one millisecond earlier it is not.
TEST(LocalKeeper, SilentMemberIsDroppedAfterDeadAfterMs) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  const std::string g0 = job.control().file;
  for (int r = 0; r < 3; ++r) job.beat(0, g0, r, 1);
  ASSERT_FALSE(keeper.poll(at(1000)).has_value());  // rank 1's last beat seen at 1000
  int64_t beat = 2;
  for (int64_t t = 1100; t < 4000; t += 100) {
    job.beat(0, g0, 0, beat);
    job.beat(0, g0, 2, beat++);
    ASSERT_FALSE(keeper.poll(at(t)).has_value()) << "dropped early, at " << t << " ms";
  }
  job.beat(0, g0, 0, beat);
  job.beat(0, g0, 2, beat++);
  const auto r = keeper.poll(at(4000));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(ids(*r), (std::vector<std::string>{"0:0.0.0", "1:0.2.0"}));
  EXPECT_EQ(r->reason, "freeze");
  ASSERT_EQ(r->lost.size(), 1u);
  EXPECT_EQ(r->lost[0], (LostMember{{0, 1, 0}, "no heartbeat for 3000 ms"}));
}

// Generation 0's workers are still loading when their heartbeats are due: no member is timed
// out before start_grace, and after it the ordinary rule applies.
TEST(LocalKeeper, GenerationZeroWaitsStartGraceForAFirstBeat) {
  Job job;
  LocalKeeper keeper(job.options(10000ms), three(), at(0));
  const std::string g0 = job.control().file;
  int64_t beat = 1;
  for (int64_t t = 0; t < 12900; t += 300) {
    if (t >= 5000) {  // ranks 0 and 2 start beating at 5 s; rank 1 never does
      job.beat(0, g0, 0, beat);
      job.beat(0, g0, 2, beat++);
    }
    ASSERT_FALSE(keeper.poll(at(t)).has_value()) << "dropped at " << t << " ms";
  }
  // The last poll inside the grace was at 9900 ms: dead 3000 ms later.
  job.beat(0, g0, 0, beat);
  job.beat(0, g0, 2, beat++);
  ASSERT_FALSE(keeper.poll(at(12899)).has_value());
  job.beat(0, g0, 0, beat);
  job.beat(0, g0, 2, beat++);
  const auto r = keeper.poll(at(12900));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(ids(*r), (std::vector<std::string>{"0:0.0.0", "1:0.2.0"}));
}

// After a change the heartbeats come from the new generation's own store, keyed by the new
// ranks: a beat written where generation 0 kept them (old file, old prefix) no longer counts.
TEST(LocalKeeper, LaterGenerationsAreWatchedInTheirOwnStore) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  keeper.on_child_exit({0, 0, 0}, 1, 0);
  const auto g1 = keeper.poll(at(100));
  ASSERT_TRUE(g1.has_value());
  EXPECT_EQ(g1->lost[0].cause, "exited with status 1");
  EXPECT_EQ(ids(*g1), (std::vector<std::string>{"0:0.1.0", "1:0.2.0"}));
  const std::string g1_file = (job.dir / "g1.store").string();
  int64_t beat = 1;
  for (int64_t t = 200; t < 3100; t += 100) {
    job.beat(1, g1_file, 0, beat);               // 0.1.0, rank 0 of generation 1
    job.beat(0, job.control().file, 2, beat++);  // 0.2.0, but where generation 0 beat
    ASSERT_FALSE(keeper.poll(at(t)).has_value()) << t;
  }
  job.beat(1, g1_file, 0, beat);
  const auto g2 = keeper.poll(at(3100));  // 3000 ms after the decision
  ASSERT_TRUE(g2.has_value());
  EXPECT_EQ(ids(*g2), (std::vector<std::string>{"0:0.1.0"}));
  EXPECT_EQ(g2->store, "file " + (job.dir / "g2.store").string());
  EXPECT_EQ(describe_change(*g1, *g2, job.options().keeper),
            "generation 2: lost rank 1 (member 0.2.0: no heartbeat for 3000 ms); 1 worker goes "
            "on");
}

// The keeper cannot open the generation's store (here: its file is gone): that is no evidence
// against the workers, and nobody is dropped for the silence it causes.
TEST(LocalKeeper, AnUnreadableStoreDropsNobody) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  keeper.on_child_exit({0, 0, 0}, 0, 6);
  ASSERT_TRUE(keeper.poll(at(100)).has_value());
  fs::remove(job.dir / "g1.store");
  for (int64_t t = 200; t <= 8000; t += 400)
    ASSERT_FALSE(keeper.poll(at(t)).has_value()) << "dropped at " << t << " ms";
}

// Generation 1's file is unlinked start_grace after generation 2 replaced it, not before;
// generation 0's (the job's control store) never.
TEST(LocalKeeper, ReplacedGenerationFilesAreUnlinkedAfterTheGrace) {
  Job job;
  LocalKeeper keeper(job.options(5000ms), three(), at(0));
  keeper.on_child_exit({0, 0, 0}, 1, 0);
  ASSERT_TRUE(keeper.poll(at(100)).has_value());
  keeper.on_child_exit({0, 1, 0}, 1, 0);
  ASSERT_TRUE(keeper.poll(at(200)).has_value());
  const fs::path g1 = job.dir / "g1.store", g2 = job.dir / "g2.store";
  job.beat(2, g2.string(), 0, 1);
  ASSERT_FALSE(keeper.poll(at(5199)).has_value());
  EXPECT_TRUE(fs::exists(g1));
  job.beat(2, g2.string(), 0, 2);
  ASSERT_FALSE(keeper.poll(at(5200)).has_value());
  EXPECT_FALSE(fs::exists(g1));
  EXPECT_TRUE(fs::exists(g2));
  EXPECT_TRUE(fs::exists(job.control().file));
}

// A worker asks to leave (SIGTERM, §2.4): the next poll proposes the generation without it —
// a proposal, not an abort — and the request is fed once, not again at every poll.
TEST(LocalKeeper, LeaveRequestIsAProposalWithoutTheLeaver) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  job.put("elastic/leave/0.1.0", "1");
  const auto r = keeper.poll(at(50));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, RecordKind::kProposal);
  EXPECT_EQ(r->reason, "leave");
  EXPECT_EQ(ids(*r), (std::vector<std::string>{"0:0.0.0", "1:0.2.0"}));
  ASSERT_EQ(r->lost.size(), 1u);
  EXPECT_EQ(r->lost[0], (LostMember{{0, 1, 0}, "left"}));
  const std::string g1 = (job.dir / "g1.store").string();
  job.beat(1, g1, 0, 1);
  job.beat(1, g1, 1, 1);
  EXPECT_FALSE(keeper.poll(at(100)).has_value());
  // Its exit afterwards (status 0) is no event for the new generation.
  keeper.on_child_exit({0, 1, 0}, 0, 0);
  EXPECT_FALSE(keeper.poll(at(150)).has_value());
}

// A replacement the launcher started (elastic.replace_dead) is admitted once it asks, not
// before: the next poll after elastic/join/<member> appears proposes the generation with it as
// the last rank, its pid from the request; an unexpected join key changes nothing.
TEST(LocalKeeper, AnExpectedReplacementJoinsOnceItAsks) {
  Job job;
  auto options = job.options();
  options.keeper.max_workers = 3;
  LocalKeeper keeper(options, three(), at(0));
  keeper.on_child_exit({0, 1, 0}, 0, 9);
  const auto death = keeper.poll(at(20));
  ASSERT_TRUE(death.has_value());
  EXPECT_EQ(death->workers(), 2);
  keeper.expect_joiner({0, 1, 1}, 1);
  job.put("elastic/join/0.7.0", "999");  // nobody the launcher started
  const std::string g1 = (job.dir / "g1.store").string();
  job.beat(1, g1, 0, 1);
  job.beat(1, g1, 1, 1);
  EXPECT_FALSE(keeper.poll(at(100)).has_value());  // the replacement has not asked yet
  job.put("elastic/join/0.1.1", "4242");
  const auto join = keeper.poll(at(150));
  ASSERT_TRUE(join.has_value());
  EXPECT_EQ(join->kind, RecordKind::kProposal);
  EXPECT_EQ(join->reason, "join");
  EXPECT_EQ(ids(*join), (std::vector<std::string>{"0:0.0.0", "1:0.2.0", "2:0.1.1"}));
  EXPECT_EQ(join->members[2].pid, 4242);
  EXPECT_EQ(join->members[2].local_rank, 1);
  EXPECT_FALSE(keeper.poll(at(200)).has_value());  // fed once
}

// A worker's report that its op failed with a peer drops that peer once its beats are 3
// heartbeat periods old (600 ms), long before dead_after_ms.
TEST(LocalKeeper, SuspectReportDropsAStalePeerEarly) {
  Job job;
  LocalKeeper keeper(job.options(), three(), at(0));
  const std::string g0 = job.control().file;
  for (int r = 0; r < 3; ++r) job.beat(0, g0, r, 1);
  ASSERT_FALSE(keeper.poll(at(0)).has_value());
  job.put("elastic/suspect/0.0.0", "0 0.2.0");
  job.beat(0, g0, 0, 2);
  job.beat(0, g0, 1, 2);
  job.beat(0, g0, 2, 2);
  ASSERT_FALSE(keeper.poll(at(100)).has_value()) << "a fresh peer is not dropped on a report";
  job.put("elastic/suspect/0.0.0", "0 0.2.0 ");  // a new report (new text) at 700 ms
  job.beat(0, g0, 0, 3);
  job.beat(0, g0, 1, 3);
  const auto r = keeper.poll(at(700));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, "suspect");
  EXPECT_EQ(ids(*r), (std::vector<std::string>{"0:0.0.0", "1:0.1.0"}));
  // Malformed reports are ignored, not fatal.
  job.put("elastic/suspect/0.1.0", "garbage");
  job.beat(1, (job.dir / "g1.store").string(), 0, 1);
  job.beat(1, (job.dir / "g1.store").string(), 1, 1);
  EXPECT_FALSE(keeper.poll(at(800)).has_value());
}

TEST(LocalKeeper, WorkersJsonAndTheWaitingAndStopLines) {
  GenerationRecord before;
  before.generation = 3;
  before.members = {{0, 0, 0, 11, {0, 0, 0}}, {1, 0, 1, 12, {0, 3, 0}}};
  EXPECT_EQ(workers_json(before),
            "{\"generation\": 3, \"workers\": [{\"rank\": 0, \"member\": \"0.0.0\", \"pid\": 11}, "
            "{\"rank\": 1, \"member\": \"0.3.0\", \"pid\": 12}]}\n");
  GenerationRecord after;
  after.generation = 4;
  after.members = {{0, 0, 0, 11, {0, 0, 0}}};
  after.lost = {{{0, 3, 0}, "exited with status 1"}};
  after.state = RecordState::kWaiting;
  KeeperOptions o;
  o.min_workers = 2;
  o.wait_s = 60;
  EXPECT_EQ(describe_change(before, after, o),
            "generation 4: lost rank 1 (member 0.3.0: exited with status 1); 1 worker left, "
            "below elastic.min_workers 2: waiting up to elastic.wait_s 60 s for more");
  after.state = RecordState::kStop;
  after.generation = 5;
  EXPECT_EQ(describe_change(before, after, o),
            "generation 5: 1 worker left after waiting elastic.wait_s 60 s, below "
            "elastic.min_workers 2: the run stops");
  EXPECT_EQ(workers_json(GenerationRecord{}), "{\"generation\": 0, \"workers\": []}\n");
}

// Autoscale through the keeper (§8): the provider's capacity gates an addition, and an
// addition that will never join (its Slurm job pended too long) fails the pending decision,
// which then cools down like a removal.
TEST(LocalKeeper, ProviderCapacityGatesAnAdditionAndAFailedOneCoolsDown) {
  Job job;
  LocalKeeperOptions o = job.options();
  o.keeper.max_workers = 2;
  AutoscaleOptions a;
  a.window_steps = 2;
  a.cooldown_steps = 10;
  a.max_workers = 2;
  a.examples_per_step = 64;
  o.autoscale = a;
  int capacity = 0, asked = 0;
  o.capacity = [&] { return ++asked, capacity; };
  LocalKeeper keeper(o, {{0, 0, 0, 100, {0, 0, 0}}}, at(0));
  int64_t step = 0;
  auto steps = [&](int n) {  // rank 0 completes n steps, 0.1 s apart
    for (int i = 0; i < n; ++i, ++step) {
      job.put("elastic/progress", str_cat(step + 1, " ", 1000 + 0.1 * step));  // 6 digits
      keeper.poll(at(100 * step));
    }
  };
  steps(10);  // warm-up and a window: measured, but no capacity
  EXPECT_GT(asked, 0);
  EXPECT_FALSE(keeper.take_scale_decision().has_value());
  capacity = 1;
  steps(1);
  const std::optional<ScaleDecision> add = keeper.take_scale_decision();
  ASSERT_TRUE(add.has_value());
  EXPECT_EQ(add->action, ScaleAction::kAdd);
  keeper.expect_joiner({0, 1, 0}, 1);
  EXPECT_TRUE(keeper.autoscale()->pending());
  EXPECT_TRUE(keeper.addition_failed({0, 1, 0}));
  EXPECT_FALSE(keeper.autoscale()->pending());
  EXPECT_FALSE(keeper.addition_failed({0, 1, 0})) << "given up twice";
  steps(9);  // within cooldown_steps of the failure: nothing
  EXPECT_FALSE(keeper.take_scale_decision().has_value());
  steps(3);
  EXPECT_TRUE(keeper.take_scale_decision().has_value()) << "tried again after the cooldown";
  // The member never asked: its join key appearing now admits nobody.
  job.put("elastic/join/0.1.0", "4242");
  keeper.poll(at(100 * step));
  EXPECT_EQ(keeper.current().workers(), 1);
}

}  // namespace
}  // namespace krab::elastic
