// Leader election and fenced writes on etcd (design docs/design/elastic.md §6.2): the one
// agent that decides generations across machines, and the guarantee that a deposed one can no
// longer write them.
//
// The protocol. Every agent holds a lease (EtcdClient::grant, kept alive by the agent) and
// campaigns with
//
//     txn  if   create_revision(leader) == 0             -- nobody leads
//          then put(leader, my id, lease = my lease)     -- I do, for as long as my lease lives
//          else get(leader)                              -- who does
//
// Exactly one campaign creates the key; everyone else learns the holder. The key dies with its
// lease: a leader that stops renewing (crashed, frozen, cut off) loses it within the lease's TTL
// (plus an election, if the etcd leader changed), and the next campaign of another agent wins.
// Agents campaign again by polling; there is no watch.
//
// Fencing. A leader's writes of shared state go through
//
//     txn  if   value(leader) == my id  [and create_revision(key) == 0, for write-once keys]
//          then put(key, value)
//
// so a deposed leader — whose lease expired while it was frozen, and who still believes it
// leads — writes nothing: the comparison and the write are one atomic step in etcd, so no
// interleaving lets a stale leader's write land after its key is gone. This needs ids that are
// never reused by another agent (krab's member ids carry an incarnation).
//
// `term`: the leader key's create revision, etcd's global counter at the moment this
// leadership began. It grows with every new leadership (even the same id winning again), so it
// orders leaderships; the rendezvous records it beside what a leader wrote.
//
// Every call is one etcd call and fails as EtcdClient's calls do (krab::Timeout when no
// endpoint answers within the client's timeout; krab::PeerLost when `lease` is gone).
// Not thread-safe beyond what the client is: an EtcdElection holds only the key's name.
#pragma once

#include <optional>
#include <string>

#include "elastic/etcd_client.h"

namespace krab::elastic {

struct Leadership {
  bool won = false;    // the caller leads (now, or already did under the same lease)
  std::string leader;  // the id that holds the key (the caller's when won)
  int64_t term = 0;    // the key's create revision: this leadership's number
};

class EtcdElection {
 public:
  // `client` must outlive the election. `leader_key`: the key the leader holds (the rendezvous
  // uses /krab/<secret digest>/leader); non-empty.
  EtcdElection(EtcdClient& client, std::string leader_key);

  // One campaign of `id` under `lease` (see the header's txn). Won when the key was created by
  // this call, or when the key already holds `id` under `lease` — the answer to an earlier
  // campaign that was retried after its reply was lost. A key holding `id` under another lease
  // is not won: that is an earlier incarnation's leadership, which must expire first.
  Leadership campaign(const std::string& id, int64_t lease);

  // Who leads now: the holder's id and term, or nullopt when nobody does.
  std::optional<Leadership> leader();

  // Writes `key` = `value` only while `id` holds the leader key; returns whether it wrote. On
  // false nothing was written. `create_only`: also only when `key` does not exist yet (a
  // generation record is written once) — false then also when the key exists.
  bool fenced_put(const std::string& key, const std::string& value, const std::string& id,
                  bool create_only = false);

  // Gives the leadership up if `id` holds it (deletes the key; the lease lives on). Returns
  // whether it did.
  bool resign(const std::string& id);

  const std::string& leader_key() const { return leader_key_; }

 private:
  EtcdClient& client_;
  std::string leader_key_;
};

}  // namespace krab::elastic
