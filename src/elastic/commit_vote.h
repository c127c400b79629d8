// The commit vote (design docs/design/elastic.md §2.2): one all-reduce per step, after the
// gradients are reduced and before the update is applied, that makes "the last completed step"
// the same on every survivor of a failure. If the vote completed on any rank, every rank of the
// group had its reduced gradient of the step (nobody enters the vote before its own reductions
// succeeded, and an all-reduce completes nowhere before every rank contributed); if it completed
// nowhere, nobody applied the step. It also carries, at no extra collective, what every rank
// must act on at the same step boundary: the newest generation each rank's MembershipView has
// seen (a pending proposal: join, leave, autoscale) and each rank's compute time of the step
// (the balancer's and the autoscaler's input).
//
// The vector is 1 + 2W int64 slots; rank r writes only its own, so the sum places every value:
//   slot 0        1 from every rank: the sum is W
//   slot 1 + r    the newest generation rank r has seen
//   slot 1 + W + r  rank r's compute microseconds of this step
#pragma once

#include <cstdint>
#include <vector>

namespace krab::comm {
class Communicator;
}

namespace krab::elastic {

struct Vote {
  int64_t seen_generation = 0;
  int64_t compute_us = 0;
};

struct VoteResult {
  int64_t newest_generation = 0;    // the largest any rank has seen
  std::vector<int64_t> compute_us;  // per rank
};

// The pure halves: rank `rank`'s contribution, and the summed vector read back. read_vote
// throws (an internal error) when slot 0 is not `world`: a rank contributed twice or not at all.
std::vector<int64_t> vote_slots(int rank, int world, const Vote& mine);
VoteResult read_vote(const std::vector<int64_t>& summed, int world);

// Runs the vote on `group` (blocking). A failure of the group (a dead peer, an aborted
// generation) throws out of the wait — PeerLost or MembershipChanged — and the step is not
// applied on this rank.
VoteResult commit_vote(comm::Communicator& group, const Vote& mine);

}  // namespace krab::elastic
