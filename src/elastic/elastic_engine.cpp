#include "elastic/elastic_engine.h"

#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "comm/reaper.h"
#include "core/errors.h"
#include "elastic/commit_vote.h"
#include "elastic/entry_gate.h"
#include "models/model.h"

namespace krab::elastic {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// This process's rank in `record`, or -1 when it is not a member.
int rank_in(const GenerationRecord& record, const MemberId& self) {
  for (const Member& m : record.members)
    if (m.id == self) return m.rank;
  return -1;
}

std::string lost_text(const GenerationRecord& record) {
  std::string out;
  for (const LostMember& l : record.lost)
    out += str_cat(out.empty() ? "" : "; ", "member ", l.id.str(), " ", l.cause);
  return out;
}

// The failures of a generation on the way in, which the keeper's next record resolves (the
// entry gate given up, a member that never came, a second failure during the reconcile):
// PeerLost (MembershipChanged included) and Timeout. Not Dropped: that record left this worker out.
bool failed_on_the_way_in(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Dropped&) {
    return false;
  } catch (const PeerLost&) {
    return true;
  } catch (const Timeout&) {
    return true;
  } catch (...) {
    return false;
  }
}

volatile sig_atomic_t g_leave = 0;

void on_sigterm(int) {
  if (g_leave) {  // asked twice: the user means it
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);
  }
  g_leave = 1;
}

}  // namespace

std::function<bool()> leave_on_sigterm() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    ::sigaction(SIGTERM, &sa, nullptr);
    return true;
  }();
  (void)installed;
  return [] { return g_leave != 0; };
}

ElasticEngine::ElasticEngine(ElasticEngineOptions options, InnerEngineFactory make_inner,
                             std::unique_ptr<comm::Communicator> group, int64_t generation)
    : options_(std::move(options)), make_inner_(std::move(make_inner)), generation_(generation) {
  KRAB_CHECK(options_.control != nullptr, "ElasticEngine: no control store");
  // Gloo writes to its peers' sockets with plain writev: a peer that died mid-op would end this
  // process with SIGPIPE instead of failing the op (EPIPE), which is what recovery needs.
  ::signal(SIGPIPE, SIG_IGN);
  if (group == nullptr) {
    join();
    return;
  }
  comm::Communicator* raw = group.get();
  workers_ = group->size();
  InnerEntry entry;
  entry.initial = true;
  inner_ = make_inner_(std::move(group), entry);
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    live_group_ = raw;
  }
  // The view starts after the first group exists, so an abort it reads always has a group to
  // abort (a record newer than `generation` that arrived meanwhile is read on its first poll).
  view_ = std::make_unique<MembershipView>(options_.control, generation, options_.view_period,
                                           [this](const GenerationRecord& r) { on_abort(r); });
}

ElasticEngine::~ElasticEngine() {
  view_.reset();  // joins the view's thread before the group it may abort goes away
}

// A joiner: asks the keeper (`elastic/join/<member>` = its pid), waits for the record that
// admits it, and enters that generation with the others (§2.4), receiving the state.
void ElasticEngine::join() {
  joined_ = true;
  generation_ = -1;
  const int64_t seen = current_generation(*options_.control);
  request_join(*options_.control, options_.self, ::getpid());
  view_ = std::make_unique<MembershipView>(options_.control, seen, options_.view_period,
                                           [this](const GenerationRecord& r) { on_abort(r); });
  const auto deadline = Clock::now() + millis(options_.wait_s);
  for (int64_t want = seen + 1;; ++want) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      throw Timeout(str_cat("elastic: member ", options_.self.str(),
                            " was not admitted to the run within ", options_.wait_s,
                            " s (elastic.wait_s)"));
    GenerationRecord record = view_->wait_for(want, left);
    if (rank_in(record, options_.self) < 0) continue;
    std::unique_ptr<comm::Communicator> group = rebuild(record, nullptr, 0);
    enter(record, std::move(group), nullptr, /*joining=*/true);
    return;
  }
}

// On the view's thread: an abort record newer than the generation this rank runs breaks its
// group now; every pending and future wait of it throws MembershipChanged.
void ElasticEngine::on_abort(const GenerationRecord& record) {
  std::lock_guard<std::mutex> lock(group_mu_);
  newest_abort_ = std::max(newest_abort_, record.generation);
  if (record.generation <= generation_.load() || live_group_ == nullptr) return;
  live_group_->abort(str_cat("generation ", record.generation, ": ", record.reason));
}

void ElasticEngine::start_at(int64_t step) {
  if (joined_) return;  // it starts from the step it received
  applied_ = step;
  inner_->start_at(step);
}

std::optional<engine::StepPlan> ElasticEngine::next_step() {
  // The last vote carried a proposal: every rank leaves its generation here, at the same step.
  if (proposed_ > generation_.load())
    throw MembershipChanged(str_cat("generation ", proposed_, " was proposed"));
  auto plan = inner_->next_step();
  if (plan) step_ = plan->step;
  compute_us_ = 0;
  return plan;
}

void ElasticEngine::after_compute(double seconds) {
  compute_us_ += static_cast<int64_t>(seconds * 1e6);
  inner_->after_compute(seconds);
}

// The vote completes on some rank only when every rank held its reduced gradient of this step
// (commit_vote.h); the update follows it. A failure of the vote leaves the step unapplied here,
// with its gradient and learning rate kept for recover()'s reconcile.
void ElasticEngine::apply(double lr) {
  pending_lr_ = lr;
  const VoteResult vote = commit_vote(*inner_->group(), Vote{view_->newest(), compute_us_});
  inner_->apply(lr);
  applied_ = step_ + 1;
  if (vote.newest_generation > generation_.load()) proposed_ = vote.newest_generation;
}

void ElasticEngine::after_step(const engine::StepPlan& plan) {
  inner_->after_step(plan);
  if (inner_->group()->rank() == 0) publish_progress(*options_.control, applied_);
  if (!leave_asked_ && options_.leave_requested && options_.leave_requested()) {
    request_leave(*options_.control, options_.self);
    leave_asked_ = true;
  }
}

nlohmann::json ElasticEngine::describe() const {
  nlohmann::json out = inner_->describe();
  out["elastic"] = {
      {"generation", generation_.load()}, {"workers", workers_}, {"changes", changes_}};
  return out;
}

// The next record this rank acts on. After a failure: the newest published after `after`.
// After a proposal the vote carried (`exact`): that very generation, which every rank of the
// group agreed on. A `waiting` record (fewer than elastic.min_workers) is waited out; `stop`
// ends the run naming the key. The keeper decides within elastic.dead_after_ms of a failure
// and stops a waiting run after elastic.wait_s, so a worker waits longer than either before it
// gives up on its own: wait_s + comm.timeout_s, from the start and again from each `waiting`.
GenerationRecord ElasticEngine::next_record(int64_t want, bool exact) {
  const auto bound = millis(options_.wait_s) + options_.comm.timeout;
  auto deadline = Clock::now() + bound;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      throw Timeout(str_cat("elastic: no usable membership generation from ", want, " within ",
                            bound.count() / 1000.0, " s (elastic.wait_s + comm.timeout_s)"));
    GenerationRecord record = view_->wait_for(want, left);
    if (!exact && view_->newest() > record.generation) {  // the keeper moved on: skip ahead
      want = view_->newest();
      continue;
    }
    if (record.state == RecordState::kStop)
      throw RunStopped(str_cat("elastic: generation ", record.generation, " stops the run: ",
                               record.workers(), " worker(s) left, fewer than elastic.min_workers",
                               record.lost.empty() ? "" : str_cat(" (", lost_text(record), ")")),
                       rank_in(record, options_.self) == 0, applied_);
    if (record.state == RecordState::kWaiting) {
      want = record.generation + 1;
      exact = false;
      deadline = Clock::now() + bound;
      continue;
    }
    return record;
  }
}

std::unique_ptr<comm::Communicator> ElasticEngine::connect(const GenerationRecord& record) {
  const int rank = rank_in(record, options_.self);
  if (rank < 0)
    throw Dropped(str_cat("elastic: member ", options_.self.str(), " is not in generation ",
                          record.generation, " (", record.reason, "): the keeper dropped it"));
  // "file PATH" (one machine: the generation's own FileStore) or "HOST:PORT" (node 0's
  // TCPStore, shared by every generation under its prefix; generation.h checked the form).
  comm::WorldInfo world;
  if (record.store.rfind("file ", 0) == 0) {
    world.rendezvous = comm::Endpoint{"127.0.0.1", 0, record.store.substr(5), options_.secret};
  } else {
    world.rendezvous = comm::parse_endpoint(record.store, "the generation's store");
    world.rendezvous.secret = options_.secret;
  }
  world.rank = rank;
  world.size = record.workers();
  world.iface = options_.iface;
  world.generation = record.generation;
  comm::Options copts = options_.comm;
  copts.abortable = true;
  // Every member passes the generation's entry gate first: one superseded while its members
  // were on their way is given up by all of them, never built by some (elastic/entry_gate.h).
  pass_entry_gate(
      *comm::prefixed(str_cat("g", record.generation, "/"),
                      comm::connect_store(world.rendezvous, copts.timeout)),
      rank, world.size, record.generation,
      [this, g = record.generation] { return view_->newest() > g; }, copts.timeout);
  return comm::make_communicator(options_.backend, world, copts);
}

// The survivors are at most one step apart (the commit vote): the one behind held the reduced
// gradient of the step the others applied (with ZeRO: its gradient shards and its ward's), and
// applies it now with the learning rate it kept, on the previous generation's engine (its
// update is local). A joiner (no previous engine) takes part and adopts the committed step;
// the new engine brings it the state of that step. The same all-reduce finds the fewest steps
// whose end a member ran (a joiner, which ran none, does not count): when that is below the
// committed step, the loop's collectives after the last committed step were cut short on some
// member, and every member runs them again (unended_step()).
void ElasticEngine::reconcile(comm::Communicator& group, engine::Engine* previous,
                              int64_t steps_ended) {
  const bool survivor = previous != nullptr;
  auto steps = torch::tensor({survivor ? applied_ : int64_t{0},
                              survivor ? -steps_ended : -std::numeric_limits<int64_t>::max()},
                             torch::kInt64);
  group.allreduce(steps, comm::ReduceOp::kMax)->wait();
  const int64_t committed = steps[0].item<int64_t>();
  const int64_t fewest_ended = -steps[1].item<int64_t>();
  unended_ = fewest_ended < committed ? committed - 1 : -1;
  if (!survivor) {
    applied_ = committed;
    return;
  }
  KRAB_CHECK(committed - applied_ <= 1 && committed >= applied_, "elastic: rank ", group.rank(),
             " applied ", applied_, " steps, the group committed ", committed);
  if (committed > applied_) {
    previous->apply(pending_lr_);
    applied_ = committed;
  }
  // A backward cut by the failure leaves partial gradients behind (§15.2).
  for (const at::Tensor& p : previous->model().parameters())
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

// Connects to `record`'s generation and reconciles on its group. A failure on the way in is one
// of that generation, and is met as a failure during training is: this rank waits for the
// keeper's next record and tries that one, from the same previous engine (nothing of it is
// given away before enter(); the reconcile can run again: a rank that applied the held step in
// a broken attempt is no longer behind). `record` ends as the generation whose group returns.
std::unique_ptr<comm::Communicator> ElasticEngine::rebuild(GenerationRecord& record,
                                                           engine::Engine* previous,
                                                           int64_t steps_ended) {
  for (;;) {
    std::unique_ptr<comm::Communicator> group;
    try {
      group = connect(record);
      {
        // The view aborts it as it aborts a running group; an abort record it read while the
        // group was being built counts too.
        std::lock_guard<std::mutex> lock(group_mu_);
        live_group_ = group.get();
        if (newest_abort_ > record.generation)
          group->abort(str_cat("generation ", newest_abort_, " supersedes it"));
      }
      reconcile(*group, previous, steps_ended);
      return group;
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(group_mu_);
        live_group_ = nullptr;
      }
      if (group != nullptr) {
        group->abort(str_cat("entering generation ", record.generation, " failed"));
        comm::Reaper::process().bury(std::move(group));
      }
      if (!failed_on_the_way_in(std::current_exception())) throw;
    }
    record = next_record(record.generation + 1, /*exact=*/false);
  }
}

// Builds the inner engine of `record`'s generation on `group` from the previous one (null for
// a joiner), which the factory brings every member to the committed step with; then the
// previous engine goes (its group, taken before, outlives it: the caller buries it).
void ElasticEngine::enter(const GenerationRecord& record, std::unique_ptr<comm::Communicator> group,
                          std::unique_ptr<engine::Engine> previous, bool joining) {
  InnerEntry entry;
  entry.previous = previous.get();
  entry.joining = joining;
  entry.joiners = joining;
  entry.step = applied_;
  joined_ids_.clear();
  for (const Member& m : record.members)
    if (std::find(members_.begin(), members_.end(), m.id) == members_.end()) {
      entry.joiners = true;
      joined_ids_ += str_cat(joined_ids_.empty() ? "" : ", ", m.id.str());
    }
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    live_group_ = group.get();
    generation_ = record.generation;
  }
  inner_ = make_inner_(std::move(group), entry);
  inner_->measure_gradient_norms(measure_norms_);  // the new generation's engine measures too
  previous.reset();
  members_.clear();
  for (const Member& m : record.members) members_.push_back(m.id);
  workers_ = record.workers();
  inner_->start_at(applied_);
}

nlohmann::json ElasticEngine::recover(const std::string& cause, int64_t steps_ended) {
  const auto t_start = Clock::now();
  const int64_t before = applied_;
  const int old_world = inner_->group()->size();
  const bool planned = proposed_ > generation_.load();
  GenerationRecord record = next_record(planned ? proposed_ : generation_.load() + 1, planned);
  // Generation 0's members, which this worker did not need until now. Read once the next record
  // came: a worker cut off from the store (§6.4) gets here when its collective times out, maybe
  // before the link returns; the view waits the cut out, where this read would fail.
  if (members_.empty())
    for (const Member& m : read_record(*options_.control, generation_.load()).members)
      members_.push_back(m.id);
  // Leave the old generation: its engine stays until the new one has taken its state, its
  // group goes to the reaper after it (never destroyed here: a frozen peer's op may hold it
  // until comm.timeout_s).
  std::unique_ptr<comm::Communicator> old_group = inner_->take_group();
  KRAB_CHECK(old_group != nullptr, "elastic: the inner engine cannot give its group up");
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    live_group_ = nullptr;
  }
  old_group->abort(str_cat("generation ", record.generation, " replaces it"));
  std::unique_ptr<engine::Engine> previous = std::move(inner_);
  if (planned && rank_in(record, options_.self) < 0) {  // this worker asked to leave
    inner_ = std::move(previous);  // model() and state() stay answerable for the run's end
    comm::Reaper::process().bury(std::move(old_group));
    generation_ = record.generation;
    return {{"left", true}, {"generation", record.generation}, {"step", applied_}};
  }

  try {
    std::unique_ptr<comm::Communicator> group = rebuild(record, previous.get(), steps_ended);
    enter(record, std::move(group), std::move(previous), /*joining=*/false);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(group_mu_);
      live_group_ = nullptr;  // enter() registered the group its factory destroyed
    }
    previous.reset();
    comm::Reaper::process().bury(std::move(old_group));
    throw;
  }
  comm::Reaper::process().bury(std::move(old_group));
  ++changes_;
  // The step in flight is lost when it was handed out and not committed (the vote completed
  // nowhere); a failure after its vote completed somewhere, or a proposal, loses nothing.
  const int64_t lost = step_ >= applied_ ? 1 : 0;
  return {{"generation", record.generation},
          {"workers", record.workers()},
          {"previous_workers", old_world},
          {"kind", std::string(kind_name(record.kind))},
          {"reason", record.reason},
          {"lost", lost_text(record)},
          {"joined", joined_ids_},
          {"cause", cause},
          {"step", applied_},
          {"lost_steps", lost},
          {"caught_up", applied_ > before},
          {"rebuild_seconds", std::chrono::duration<double>(Clock::now() - t_start).count()},
          {"decided_at", record.decided_at_ms / 1000.0}};
}

}  // namespace krab::elastic
