// ElasticEngine: data parallel on a membership that changes during training
// (docs/design/elastic.md §2). It wraps the data-parallel engine of the current generation and
// adds three things to the engine calls the loop already makes:
//
//   apply(lr)      the commit vote first (elastic/commit_vote.h): one small all-reduce that
//                  completes on some rank only if every rank held its reduced gradient; then
//                  the inner engine's update. So after a failure the survivors are at most one
//                  step apart, and the one behind holds the gradient to catch up.
//   after_step     rank 0 writes the completed step to `elastic/progress` for the keeper.
//   recover(cause) after any call threw because the group broke (MembershipChanged from an
//                  abort, PeerLost, Timeout): waits for the keeper's next generation record,
//                  hands the old group to the reaper, builds the new group in this process
//                  (through the generation's entry gate: see "Two changes" below),
//                  reconciles the committed step (an all-reduce of each survivor's applied
//                  steps: the one behind applies the gradient it holds with the learning rate
//                  it kept) and the end of that step (the same all-reduce carries the steps
//                  whose end each member ran: unended_step()), builds the next inner engine on the
//                  same model adopting the same optimizer (no copy, no initial broadcast: every
//                  survivor holds the same parameters), has rank 0 broadcast its buffers, clears
//                  the gradients, and resumes the step counter at the committed step. next_step()
//                  then hands out the first uncommitted step, sliced for the new world: the global
//                  batch is fixed (the inner engine's global micro-batch), only its split changes.
//
// Who decides: never this engine. The keeper (the launcher on one machine) publishes the
// records (elastic/membership_view.h); the engine's MembershipView thread aborts the group the
// moment an abort record newer than the running generation appears, so every pending wait of
// the broken generation throws within one slice (comm::Options::abortable).
//
// Planned changes (§2.4): a proposal record (a join, a graceful leave) interrupts nothing. The
// commit vote carries the newest generation each rank has seen, so every rank learns of it at
// the same step; the step completes, and the next next_step() throws MembershipChanged so the
// loop calls recover(), which moves to exactly that generation (no step lost, nothing to
// reconcile). A member the record leaves out (a leaver) gets {"left": true} back and ends its
// run. A joiner is an engine built without a group: its constructor announces it
// (`elastic/join/<member>`), waits for the record that admits it, joins that group and
// receives the state.
//
// Which engine runs a generation, and how its state moves, is the factory's
// (InnerEngineFactory): data parallel adopts the previous engine's optimizer, and when the
// new generation has joiners rank 0 sends them its replica (train/peer_state.h); ZeRO stages
// 1-3 build the new layout's shards and fill them from the previous generation's own and ward
// shards, wherever they now live (train/live_reshard.h, parallel/zero/buddy.h). The previous
// engine stays alive until the new one has its state.
//
// Two changes within one rebuild (the race): the keeper may publish g+2 while the survivors of
// g are reading g+1 (a second failure, or a rejoin, soon after the first). A survivor that reads
// late skips straight to g+2, so g+1's group can never be complete. Every member therefore
// enters a generation through its entry gate (elastic/entry_gate.h) before Gloo's rendezvous:
// the members agree in the generation's store either to build its group (all of them arrived)
// or to give it up (a newer record appeared first); a member that gave it up moves on to the
// newest record within a few milliseconds, from the same previous engine. A failure later on
// the way in (a second failure during the reconcile; an abort record newer than g+1 aborts
// g+1's group there as it would a running one) is met the same way: the next record, entered
// from the same previous engine (ElasticEngine::rebuild).
//
// Not yet: waiting for joiners below min_workers (a `waiting` record is waited out; `stop`
// ends the run with an error naming elastic.min_workers); a failure during the state transfer
// (the factory, which may already have taken the previous engine's optimizer) ends the run; a
// member lost between the gate's "build" and the end of Gloo's rendezvous (which cannot be
// called off) still costs the others comm.timeout_s there before they move on.
//
// Process-wide effect: the constructor ignores SIGPIPE (a write to a dead peer's socket must
// fail the op, not end the process).
//
// Thread safety: one training thread calls the Engine methods; the view's thread only aborts.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "comm/communicator.h"
#include "comm/factory.h"
#include "comm/store.h"
#include "core/errors.h"
#include "elastic/generation.h"
#include "elastic/membership_view.h"
#include "engine/engine.h"

namespace krab::elastic {

struct ElasticEngineOptions {
  MemberId self;           // this process (KRAB_MEMBER_ID)
  comm::StorePtr control;  // the job's control store: records, progress
  std::string backend;     // comm.backend (gloo)
  comm::Options comm;      // options of every generation's group (abortable is forced on)
  std::string secret;      // the job secret of every generation's store
  std::string iface;       // comm.iface
  double wait_s = 60;      // elastic.wait_s: longest wait for a record and for a rendezvous
  std::chrono::milliseconds view_period{50};
  // True once this worker was asked to leave (SIGTERM): at the next step boundary the engine
  // asks the keeper (`elastic/leave/<member>`), and leaves at the step its proposal takes effect.
  std::function<bool()> leave_requested;
};

// What generation g's inner engine is built from (InnerEngineFactory).
struct InnerEntry {
  // The previous generation's engine: alive, its group aborted (it may not communicate), at
  // the committed step; what the new engine starts from (its optimizer to adopt, its shards
  // to reshard). Null for the run's first group and for a joiner.
  engine::Engine* previous = nullptr;
  bool initial = false;  // the run's first group: the engine broadcasts rank 0's state
  bool joining = false;  // this process is a joiner: it holds nothing yet
  bool joiners = false;  // the new generation has members the previous one did not
  int64_t step = 0;      // the committed step, which every member starts from
};

// Builds generation g's inner engine on `group` and, unless `entry.initial`, brings this
// member to the committed step: collective on `group` (every member calls it with the same
// `joiners` and `step`). The data-parallel factory adopts the previous optimizer and, with
// joiners, sends rank 0's replica (`transfer`); a sharded (ZeRO) one reshards the previous
// generation's shards into the new layout (train/live_reshard.h). Either way the result holds
// the committed step's state on every member, buffers included.
using InnerEngineFactory = std::function<std::unique_ptr<engine::Engine>(
    std::unique_ptr<comm::Communicator> group, const InnerEntry& entry)>;

// The keeper stopped the run (a `stop` record: fewer than elastic.min_workers were left for
// elastic.wait_s, §2.5). `writer()`: this worker is the record's rank 0 and writes the
// checkpoint of `step()`, the steps it applied, before the run ends (exit 1).
class RunStopped : public Error {
 public:
  RunStopped(const std::string& what, bool writer, int64_t step)
      : Error(what), writer_(writer), step_(step) {}
  bool writer() const { return writer_; }
  int64_t step() const { return step_; }

 private:
  bool writer_;
  int64_t step_;
};

// This worker is not a member of the generation it was to enter: the keeper dropped it (it was
// cut off from the others longer than elastic.dead_after_ms, or frozen). The process exits
// with kExitDropped (EX_TEMPFAIL) and its launcher may start it again as a joiner: it rejoins
// the run with the state of the step the others are at (§6.4).
inline constexpr int kExitDropped = 75;
class Dropped : public PeerLost {
 public:
  using PeerLost::PeerLost;
  int exit_code() const override { return kExitDropped; }
};

// The worker's graceful leave (§2.4): installs a SIGTERM handler that only sets a flag (the
// first call does; later calls return the same reader), and returns the reader of that flag for
// ElasticEngineOptions::leave_requested. A second SIGTERM while leaving still ends the process.
std::function<bool()> leave_on_sigterm();

class ElasticEngine : public engine::Engine {
 public:
  // `group`: generation `generation`'s communicator, already built (the trainer's first group).
  // A null group makes a joiner: it waits (up to elastic.wait_s) for a record that has it as a
  // member, joins that generation and receives the committed state (applied_steps()).
  ElasticEngine(ElasticEngineOptions options, InnerEngineFactory make_inner,
                std::unique_ptr<comm::Communicator> group, int64_t generation);
  ~ElasticEngine() override;

  std::string name() const override { return "sync"; }
  models::Model& model() override { return inner_->model(); }
  // Ignored by a joiner: it starts from the step it received.
  void start_at(int64_t step) override;
  std::optional<engine::StepPlan> next_step() override;
  void before_backward(int64_t micro, bool last) override { inner_->before_backward(micro, last); }
  void after_compute(double seconds) override;
  void reduce_gradients() override { inner_->reduce_gradients(); }
  void apply(double lr) override;
  void after_step(const engine::StepPlan& plan) override;
  comm::Communicator* group() override { return inner_->group(); }
  engine::TrainState state() override { return inner_->state(); }
  void settle() override { inner_->settle(); }
  void after_restore() override { inner_->after_restore(); }
  engine::MemoryStats memory() const override { return inner_->memory(); }
  std::vector<engine::PhaseSpan> step_spans() const override { return inner_->step_spans(); }
  void measure_gradient_norms(bool on) override {
    measure_norms_ = on;
    inner_->measure_gradient_norms(on);
  }
  std::optional<std::pair<double, double>> gradient_norms() const override {
    return inner_->gradient_norms();
  }
  bool visit_parameters(const engine::ParameterVisitor& fn) override {
    return inner_->visit_parameters(fn);
  }
  void with_whole_model(const std::function<void()>& fn) override { inner_->with_whole_model(fn); }
  nlohmann::json describe() const override;

  bool can_recover() const override { return true; }
  nlohmann::json recover(const std::string& cause, int64_t steps_ended) override;
  int64_t unended_step() override { return std::exchange(unended_, -1); }

  int64_t generation() const { return generation_.load(); }
  // The newest generation this worker's view has read (a proposal not yet in force included).
  int64_t newest_seen() const { return view_->newest(); }
  // Steps whose update this rank applied (the committed steps once recover() returned).
  int64_t applied_steps() const { return applied_; }

 private:
  void join();
  GenerationRecord next_record(int64_t want, bool exact);
  std::unique_ptr<comm::Communicator> connect(const GenerationRecord& record);
  std::unique_ptr<comm::Communicator> rebuild(GenerationRecord& record, engine::Engine* previous,
                                              int64_t steps_ended);
  void enter(const GenerationRecord& record, std::unique_ptr<comm::Communicator> group,
             std::unique_ptr<engine::Engine> previous, bool joining);
  void reconcile(comm::Communicator& group, engine::Engine* previous, int64_t steps_ended);
  void on_abort(const GenerationRecord& record);

  ElasticEngineOptions options_;
  InnerEngineFactory make_inner_;
  std::unique_ptr<engine::Engine> inner_;
  bool measure_norms_ = false;  // measure_gradient_norms(), for every generation's engine
  std::atomic<int64_t> generation_;
  std::mutex group_mu_;  // the view's thread aborts the group the training thread replaces
  comm::Communicator* live_group_ = nullptr;  // guarded by group_mu_
  int64_t newest_abort_ = -1;                 // the newest abort record read; guarded by group_mu_
  std::unique_ptr<MembershipView> view_;

  int64_t applied_ = 0;     // steps applied on this rank
  int64_t step_ = -1;       // the step handed out last
  double pending_lr_ = 0;   // the learning rate of the step being voted on
  int64_t compute_us_ = 0;  // this step's forward and backward, for the vote
  int64_t changes_ = 0;
  int workers_ = 0;                // the current generation's
  std::vector<MemberId> members_;  // the current generation's, in rank order ({} at the start)
  int64_t proposed_ = -1;          // a proposal the last vote carried: the generation to move to
  bool joined_ = false;            // built as a joiner
  bool leave_asked_ = false;       // elastic/leave/<member> written
  std::string joined_ids_;         // the members the last change added ("0.1.1, ...")
  int64_t unended_ = -1;           // unended_step()'s answer, from the last reconcile
};

}  // namespace krab::elastic
