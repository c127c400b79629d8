#include "elastic/entry_gate.h"

#include <string>
#include <thread>
#include <vector>

#include "comm/peer_monitor.h"
#include "core/errors.h"

namespace krab::elastic {
namespace {

using Clock = std::chrono::steady_clock;

// Short against a rebuild (0.1-0.3 s, design §2.3), long against a store round trip.
constexpr std::chrono::milliseconds kPoll{5};

constexpr const char* kVerdictKey = "entry/verdict";
const std::vector<uint8_t> kBuild{'b', 'u', 'i', 'l', 'd'};
const std::vector<uint8_t> kAbandon{'a', 'b', 'a', 'n', 'd', 'o', 'n'};

std::string arrived_key(int rank) { return str_cat("entry/arrived/", rank); }

// Proposes `mine` and returns the verdict: the first proposal, whoever made it.
bool verdict_is_build(c10d::Store& store, const std::vector<uint8_t>& mine) {
  return store.compareSet(kVerdictKey, {}, mine) == kBuild;
}

std::vector<int> missing(c10d::Store& store, int size) {
  std::vector<int> out;
  for (int r = 0; r < size; ++r)
    if (!store.check({arrived_key(r)})) out.push_back(r);
  return out;
}

}  // namespace

void pass_entry_gate(c10d::Store& store, int rank, int size, int64_t generation,
                     const std::function<bool()>& superseded, std::chrono::milliseconds timeout) {
  store.set(arrived_key(rank), {'1'});
  std::vector<std::string> everyone;
  for (int r = 0; r < size; ++r) everyone.push_back(arrived_key(r));
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    // A verdict taken while this member was on its way stands, whatever it sees now.
    if (store.check({kVerdictKey})) {
      if (store.get(kVerdictKey) == kBuild) return;
      break;
    }
    // Arrival is checked before supersession: when everyone is here, building is always safe
    // (the group completes), and the newer record is then handled on the group that exists.
    if (store.check(everyone)) {
      if (verdict_is_build(store, kBuild)) return;
      break;
    }
    if (superseded()) {
      if (verdict_is_build(store, kAbandon)) return;
      break;
    }
    if (Clock::now() >= deadline) {
      if (verdict_is_build(store, kAbandon)) return;
      throw Timeout(str_cat("elastic: generation ", generation, "'s group (", size, " members): ",
                            comm::describe_ranks(missing(store, size)), " did not arrive within ",
                            timeout.count() / 1000.0, " s (comm.timeout_s)"));
    }
    std::this_thread::sleep_for(kPoll);
  }
  throw MembershipChanged(
      str_cat("generation ", generation, " was given up before its group was built"));
}

}  // namespace krab::elastic
