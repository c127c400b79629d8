#include "elastic/etcd_election.h"

#include "core/errors.h"

namespace krab::elastic {

EtcdElection::EtcdElection(EtcdClient& client, std::string leader_key)
    : client_(client), leader_key_(std::move(leader_key)) {
  KRAB_CHECK_ARG(!leader_key_.empty(), "EtcdElection: the leader key is empty");
}

Leadership EtcdElection::campaign(const std::string& id, int64_t lease) {
  KRAB_CHECK_ARG(!id.empty(), "etcd campaign: the candidate id is empty");
  KRAB_CHECK_ARG(lease != 0, "etcd campaign of '", id, "': a leader key needs a lease");
  const EtcdTxnResult r =
      client_.txn({EtcdCompare::absent(leader_key_)}, {EtcdOp::put(leader_key_, id, lease)},
                  {EtcdOp::get(leader_key_)});
  if (r.succeeded) return {true, id, r.revision};  // created by this txn: its revision
  // The key existed at the txn's revision, so the get saw it — unless nothing came back, which
  // a txn cannot produce; a holder that vanished since is found by the next campaign.
  if (r.ranges.empty() || r.ranges[0].empty()) return {false, "", 0};
  const EtcdKeyValue& held = r.ranges[0][0];
  // Ours under the same lease: a retried campaign whose first attempt had won.
  const bool ours = held.value == id && held.lease == lease;
  return {ours, held.value, held.create_revision};
}

std::optional<Leadership> EtcdElection::leader() {
  const std::optional<EtcdKeyValue> held = client_.get(leader_key_);
  if (!held) return std::nullopt;
  return Leadership{false, held->value, held->create_revision};
}

bool EtcdElection::fenced_put(const std::string& key, const std::string& value,
                              const std::string& id, bool create_only) {
  KRAB_CHECK_ARG(!id.empty(), "etcd fenced put of '", key, "': the writer id is empty");
  KRAB_CHECK_ARG(key != leader_key_, "etcd fenced put: '", key, "' is the leader key itself");
  std::vector<EtcdCompare> compare = {EtcdCompare::value_is(leader_key_, id)};
  if (create_only) compare.push_back(EtcdCompare::absent(key));
  // The failure branch reads nothing: the caller learns the holder through leader().
  return client_.txn(compare, {EtcdOp::put(key, value)}, {}).succeeded;
}

bool EtcdElection::resign(const std::string& id) {
  return client_.txn({EtcdCompare::value_is(leader_key_, id)}, {EtcdOp::erase(leader_key_)}, {})
      .succeeded;
}

}  // namespace krab::elastic
