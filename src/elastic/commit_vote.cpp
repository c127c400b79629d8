#include "elastic/commit_vote.h"

#include <torch/torch.h>

#include "comm/communicator.h"
#include "core/errors.h"

namespace krab::elastic {

std::vector<int64_t> vote_slots(int rank, int world, const Vote& mine) {
  KRAB_CHECK(world >= 1 && rank >= 0 && rank < world, "rank ", rank, " of ", world);
  std::vector<int64_t> slots(1 + 2 * static_cast<size_t>(world), 0);
  slots[0] = 1;
  slots[1 + rank] = mine.seen_generation;
  slots[1 + world + rank] = mine.compute_us;
  return slots;
}

VoteResult read_vote(const std::vector<int64_t>& summed, int world) {
  KRAB_CHECK(summed.size() == 1 + 2 * static_cast<size_t>(world) && summed[0] == world,
             "a commit vote of ", summed.empty() ? 0 : summed[0], " ranks in a group of ", world);
  VoteResult result;
  for (int r = 0; r < world; ++r)
    result.newest_generation = std::max(result.newest_generation, summed[1 + r]);
  result.compute_us.assign(summed.begin() + 1 + world, summed.end());
  return result;
}

VoteResult commit_vote(comm::Communicator& group, const Vote& mine) {
  const std::vector<int64_t> slots = vote_slots(group.rank(), group.size(), mine);
  at::Tensor t = torch::tensor(slots, torch::kInt64);
  group.allreduce(t)->wait();
  const int64_t* p = t.data_ptr<int64_t>();
  return read_vote(std::vector<int64_t>(p, p + t.numel()), group.size());
}

}  // namespace krab::elastic
