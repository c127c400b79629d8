// One machine's part in the etcd rendezvous (docs/design/elastic.md §6.2): `krab train
// --rdzv-backend etcd --rdzv-endpoints H:P,...`. No machine holds what the run cannot lose:
// the membership's records and requests live in etcd (EtcdStore), and whichever machine leads
// keeps the membership; when it dies, another takes over.
//
// Keys, all under the run's prefix /krab/<digest of the job secret>/runs/<run id>/:
//   nodes/<n>   "alive", under this machine's lease (elastic.lease_s), renewed by a thread of
//               its own; gone within the lease's TTL once the machine (or its launcher) dies
//   leader      the leading machine's id, under its lease (etcd_election.h)
//   rdzv        HOST:PORT of node 0's first store (generation 0's group and the job agreement)
//   elastic/... the records and requests (membership_view.h, node_requests.h)
// The run id is node 0's choice (random), published at /krab/<digest>/run under node 0's lease:
// a later run with the same secret gets its own prefix, and the key of a run whose node 0 is
// gone vanishes with that node's lease, so a machine never joins a dead run's records.
//
// Leadership: node 0 leads from the start (it campaigns before any other machine can read
// the run id). The others campaign only once the leader key is gone (its lease expired); the
// winner takes over the membership from the newest record (LocalKeeper's takeover) with a
// store of its own. A leader whose lease lapsed (frozen, cut off from etcd) is fenced: every
// write of its keeper fails (PeerLost) while it believes it leads.
//
// Every call is bounded by `timeout` (comm.timeout_s); failures are the EtcdClient's.
// Thread safety: the lease thread is internal; the other calls from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"

namespace krab::elastic {

class EtcdClient;

struct EtcdRendezvousOptions {
  std::string endpoints;  // --rdzv-endpoints
  std::string secret;     // the job secret
  int node = 0;           // --node-rank
  double lease_s = 5;     // elastic.lease_s
  std::chrono::milliseconds timeout{60000};
};

class EtcdRendezvous {
 public:
  // Node 0: draws the run id and publishes it; the others wait up to `timeout` for it (else
  // Timeout naming the endpoints and what to start). Then every node registers nodes/<n> under
  // a lease of its own, kept alive until destruction (which revokes it).
  explicit EtcdRendezvous(const EtcdRendezvousOptions& options);
  ~EtcdRendezvous();
  EtcdRendezvous(const EtcdRendezvous&) = delete;
  EtcdRendezvous& operator=(const EtcdRendezvous&) = delete;

  const std::string& run_id() const { return run_; }
  // The run's store (unfenced): what agents write (exits, announcements) and read (records).
  comm::StorePtr store() const { return store_; }
  // One campaign for the leadership; true when this machine leads (now or already).
  bool campaign();
  // The keeper's store once this machine leads: writes fail once the leadership is lost.
  comm::StorePtr fenced_store() const { return fenced_; }
  bool leader_present();
  std::vector<int> live_nodes();
  // False once the lease could not be renewed (expired: this machine's keys are gone).
  bool lease_alive() const { return lease_alive_.load(); }

  void publish_rendezvous(const comm::Endpoint& at);          // node 0
  comm::Endpoint wait_rendezvous(std::chrono::milliseconds);  // the others (no secret set)

 private:
  void renew();

  EtcdRendezvousOptions options_;
  std::shared_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdClient> lease_client_;  // the lease thread's own connection
  std::string run_;
  std::string prefix_;  // the run's
  int64_t lease_ = 0;
  comm::StorePtr store_, fenced_;
  std::atomic<bool> lease_alive_{true};
  std::atomic<bool> stop_{false};
  std::thread renewer_;
};

// The run's prefix in etcd (see the header): workers rebuild it from the secret and the run id
// their launcher gives them (KRAB_RDZV_RUN).
std::string etcd_run_prefix(const std::string& secret, const std::string& run);

}  // namespace krab::elastic
