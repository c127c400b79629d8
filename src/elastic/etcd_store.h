// A c10d::Store whose keys live in etcd (docs/design/elastic.md §6.2): what the keeper and the
// machines' agents share in a rendezvous across machines — the generation records, the
// workers' requests, the reports of other machines — outlives every one of them, so the loss of
// any machine (the one that started the job included) loses nothing of it while etcd keeps a
// quorum. The membership code (elastic/membership_view.h, local_keeper.h, node_requests.h)
// speaks c10d::Store; this adapter lets it speak to etcd unchanged.
//
// Keys go under `prefix` (the rendezvous uses /krab/<digest of the job secret>/, as
// comm/store.h names the job's keys in a TCPStore); values are the same bytes a FileStore or
// TCPStore would hold (a counter of add() is its decimal text). Semantics follow TCPStore's:
//   set          put (fenced, see below)
//   compareSet   one txn: writes `desired` when the key holds `expected` (or is absent and
//                `expected` is empty); returns the value the key holds afterwards (when the
//                key is absent and `expected` is not empty: `expected`, as TCPStore does)
//   get          waits up to the store's timeout for the key, then its value (else Timeout)
//   add          compare-and-swap on the key's mod revision, retried on a conflict
//   check        every key present; deleteKey; getNumKeys (the keys under the prefix)
//   wait         polls every 20 ms up to the timeout (Timeout naming the keys)
// Fencing: after fence(key, value) every write (set, compareSet, add, deleteKey) is a txn that
// also requires etcd's `key` to hold `value` — the election's leader key and this agent's id
// (elastic/etcd_election.h) — and throws PeerLost, writing nothing, when it does not: a
// deposed leader can no longer publish. Reads are not fenced.
//
// Every call is one or a few EtcdClient calls and fails as they do (Timeout when no member
// answers within the client's bound). Thread safety: as the client (calls serialised).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace krab::elastic {

class EtcdClient;

class EtcdStore : public c10d::Store {
 public:
  EtcdStore(std::shared_ptr<EtcdClient> client, std::string prefix,
            std::chrono::milliseconds timeout);
  ~EtcdStore() override;

  void fence(std::string key, std::string value);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::optional<std::string> read(const std::string& key);

  std::shared_ptr<EtcdClient> client_;
  std::string prefix_;
  std::optional<std::pair<std::string, std::string>> fence_;  // (key, value) every write needs
};

// The prefix of a job's keys in etcd: /krab/<SHA-1 of the secret>/ (the secret itself never
// leaves the machine). Empty secret: /krab/open/.
std::string etcd_job_prefix(const std::string& secret);

}  // namespace krab::elastic
