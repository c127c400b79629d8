// The entry gate of a generation (docs/design/elastic.md §2.3): before the members of
// generation g build its group, they agree through g's store whether to build it at all.
//
// Why: the keeper may publish g+1 while the members of g are still on their way into g (a
// second failure, or a rejoin, within one rebuild). A member that reads the records late skips
// straight to the newest (ElasticEngine::next_record), so g's group would never be complete; a
// member that read g in time would wait in g's Gloo rendezvous until comm.timeout_s and end the
// run. Gloo's rendezvous cannot be called off half way (a member that has read every address
// waits in its socket connects, beyond the store's reach), so the decision comes before it:
//
//   1. each member writes `entry/arrived/<rank>`;
//   2. each polls, every few milliseconds, until one of:
//        every member arrived           -> it proposes "build";
//        `superseded()` (a newer record) -> it proposes "abandon";
//        `timeout` passed                -> it proposes "abandon", then reports the missing;
//   3. a proposal is a compare-and-set of `entry/verdict` from absent: the first one is the
//      verdict, and every member (one arriving after it too) reads and follows that one.
//
// So either every member builds the group (and all of them are there: Gloo's rendezvous
// completes), or none does and each moves on to the newest record. A member that proposed
// "abandon" but lost to "build" builds; one that saw every member arrive but lost to "abandon"
// abandons. The cost is one key per member and one polling interval on the way in.
//
// The keys are the store's as given: pass the generation's own prefix ("g<g>/"), the one its
// group's keys live under, so that no other generation's gate is ever read.
#pragma once

#include <chrono>
#include <functional>

#include "comm/store.h"

namespace krab::elastic {

// Runs the gate for member `rank` of `size` on `store`, which must be generation `generation`'s
// (its prefix applied). Returns when the verdict is to build the group. Throws
// comm's MembershipChanged (a PeerLost) when it is to abandon it because a newer generation was
// published, or krab::Timeout naming the ranks that did not arrive within `timeout` (then the
// verdict is also "abandon": a member arriving later does not wait for the others). Blocks up
// to `timeout` plus one polling interval; `superseded` is called from this thread only.
void pass_entry_gate(c10d::Store& store, int rank, int size, int64_t generation,
                     const std::function<bool()>& superseded, std::chrono::milliseconds timeout);

}  // namespace krab::elastic
