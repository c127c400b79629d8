// A small etcd v3 client: key/value, transactions and leases over etcd's JSON gateway (design
// docs/design/elastic.md §6.2, checks in §15.6). The foundation of krab's rendezvous across
// machines: the agents' registrations, the leader election and the fenced generation records
// (elastic/etcd_election.h) are built from these calls.
//
// Wire. Every call is one `POST http://<endpoint>/v3/<service>/<method>` with a JSON body, the
// gateway that etcd 3.4 and 3.5 both serve in front of their gRPC API. Keys and values are
// arbitrary bytes (base64 on the wire), so a value may hold a serialised record with NULs in
// it. Revisions, lease IDs and TTLs are int64s (lease IDs exceed 2^53, so they travel as JSON
// strings and never pass through a double); a field the answer leaves out means zero, false or
// empty (proto3), which is how a failed txn or a missing key looks.
//
// Endpoints and fail-over. The client is given the members' client addresses ("host:port",
// the `--rdzv-endpoints` list) and keeps one kept-alive HTTP connection per endpoint (with
// TCP_NODELAY: without it every request after the first waits ~45 ms for a delayed ACK). A call
// goes to the endpoint that answered last; if that endpoint cannot be reached, does not answer
// within `attempt_timeout`, or answers that it cannot serve the request now (HTTP 5xx: "no
// leader", "request timed out" — a member cut off from the others), the call moves on to the next
// endpoint of the list, round and round, pausing briefly after each full round, until
// `timeout` has passed since the call began. The endpoint that answers becomes the one the
// next call tries first.
//
// Retries and ambiguity. A request whose answer was lost (the member died after applying it,
// or was cut off by `attempt_timeout` and applied it later) is sent again to the next member.
// For put, get, delete, keepalive and revoke that is harmless; a txn may then see its own
// earlier write and take its failure branch, and a grant may leak a lease that expires on its
// own. Callers that care (the election) read what the txn's failure branch returns and
// recognise their own value.
//
// Failures, all krab exceptions (core/errors.h) whose message names the operation, the key,
// the endpoint(s) and etcd's own message:
//   Timeout          no endpoint answered within `timeout`; lists each endpoint's last error
//                    ("127.0.0.1:2379: connection refused") and the bound.
//   PeerLost         etcd does not know the lease the call names (it expired or was revoked):
//                    whatever that lease held is gone. Thrown by put/txn with a lease;
//                    keepalive and revoke report it by their return value instead.
//   Error            etcd refused the request for another reason (its gRPC code and message).
//   CorruptData      an answer that is not the JSON etcd sends (a proxy, a wrong port), or
//                    larger or deeper than etcd's answers can be (elastic/etcd_wire.h).
//   InvalidArgument  the caller's mistake: a malformed endpoint list (names the item), an empty
//                    key, a TTL below 1.
//
// Thread safety: an EtcdClient may be shared by threads; its calls are serialised (one request
// in flight per client), so a thread that must not wait behind a slow call (a lease keeper
// behind a 7 s no-quorum range) should have its own client.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace krab::elastic {

// What a range returns for one key (etcd's mvccpb.KeyValue). Revisions are etcd's global
// revision counter at the key's creation and last modification; `version` counts the key's
// writes since its creation; `lease` is 0 when the key is not attached to a lease.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One comparison of a txn; the txn's success branch runs when all of them hold.
struct EtcdCompare {
  enum class Target { kValue, kCreateRevision, kModRevision };
  Target target = Target::kValue;
  std::string key;
  std::string value;     // kValue: the bytes the key must hold (a missing key never matches)
  int64_t revision = 0;  // kCreateRevision / kModRevision: the revision it must equal

  // The key does not exist (its create revision is 0).
  static EtcdCompare absent(std::string key);
  // The key exists and holds exactly `value`.
  static EtcdCompare value_is(std::string key, std::string value);
  // The key was last written at `revision` (0: it does not exist).
  static EtcdCompare mod_revision_is(std::string key, int64_t revision);
};

// One operation of a txn branch: a put (under `lease` when non-zero), a get of one key (or of
// every key under the prefix `key` when `prefix`), or a delete of one key (or of a prefix).
struct EtcdOp {
  enum class Kind { kPut, kGet, kDelete };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;
  int64_t lease = 0;
  bool prefix = false;

  static EtcdOp put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp get(std::string key);
  static EtcdOp get_prefix(std::string prefix);
  static EtcdOp erase(std::string key);
};

struct EtcdTxnResult {
  bool succeeded = false;  // which branch ran
  int64_t revision = 0;    // the store's revision after the txn
  // One entry per op of the branch that ran, in order: the keys a get found (sorted by key),
  // empty for a put or a delete.
  std::vector<std::vector<EtcdKeyValue>> ranges;
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_s = 0;  // as granted: etcd raises a TTL below its minimum (2 s at the defaults)
};

// What one member says of itself (/v3/maintenance/status). Member IDs are etcd's uint64s.
struct EtcdStatus {
  std::string endpoint;    // the member that answered
  uint64_t member_id = 0;  // its ID
  uint64_t leader_id = 0;  // the raft leader it knows (0 while there is none)
  int64_t raft_term = 0;
};

class EtcdClient {
 public:
  struct Options {
    // "host:port" of each member's client URL, tried in this order. Must not be empty.
    std::vector<std::string> endpoints;
    // Bound of one call, every endpoint and retry included (krab passes comm.timeout_s).
    std::chrono::milliseconds timeout{60000};
    // Bound of one request to one endpoint (connect + send + answer), after which the call
    // moves on to the next. Below etcd's own 7 s: a follower holds a request it forwarded to
    // a leader that just died until that limit, although a new leader is elected within ~1 s
    // (SIGKILL of the leader of 3 members: 7.0 s to the first answer with an 8 s bound).
    std::chrono::milliseconds attempt_timeout{3000};
  };

  // Parses "host:port,host:port,..." (the --rdzv-endpoints syntax). Throws InvalidArgument naming
  // `what` (the flag or key the list came from) and the bad item: an empty list or item, a
  // missing or non-numeric port, a port outside 1..65535.
  static std::vector<std::string> parse_endpoints(const std::string& list, const std::string& what);

  // Connects lazily: constructing never blocks and never fails for an unreachable endpoint.
  explicit EtcdClient(Options options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The endpoint that answered the last call (the one the next call tries first).
  std::string current_endpoint() const;

  // Writes `value` under `key` (attached to `lease` when non-zero). Returns the new revision.
  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  // The key's record, or nullopt when it does not exist.
  std::optional<EtcdKeyValue> get(const std::string& key);
  // Every key that starts with `prefix` (an empty prefix: every key), sorted by key.
  std::vector<EtcdKeyValue> get_prefix(const std::string& prefix);
  // Deletes the key (or every key under the prefix). Returns how many were deleted.
  int64_t erase(const std::string& key);
  int64_t erase_prefix(const std::string& prefix);
  // If every comparison holds, runs `success`, else `failure` — atomically.
  EtcdTxnResult txn(const std::vector<EtcdCompare>& compare, const std::vector<EtcdOp>& success,
                    const std::vector<EtcdOp>& failure);

  // A new lease of `ttl_s` seconds (>= 1). Its keys vanish when it is neither kept alive nor
  // revoked for its TTL (etcd checks expiry about every 0.5 s; across a leader change expiry
  // takes an election longer, as the new leader renews every lease).
  EtcdLease grant(int64_t ttl_s);
  // Renews the lease to its full TTL once. Returns that TTL, or 0 when the lease no longer
  // exists (expired or revoked): its keys are gone and a new lease must be granted.
  int64_t keepalive(int64_t lease);
  // Ends the lease now and deletes its keys. Returns false when the lease no longer existed
  // (expired, or revoked already: a retried revoke), true when this call ended it.
  bool revoke(int64_t lease);

  // The status of the member that answers (diagnostics, and tests that must find the leader).
  EtcdStatus status();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The launcher's start-time check of an etcd endpoint list (§6.2): parses `list` and asks for a
// member's status, bounded by `timeout`. Returns that status. A list that does not parse, or
// no member answering in time, throws InvalidArgument (exit 2) naming `flag` and the list,
// e.g. "--rdzv-endpoints 10.0.0.1:2379,10.0.0.2:2379: no etcd answered within 60 s
// (comm.timeout_s) [etcd status: ... 10.0.0.1:2379: connect timed out; ...]" — `timeout_key`
// names where the bound came from; the bracket is the client's Timeout, each endpoint's error.
EtcdStatus require_etcd(const std::string& flag, const std::string& list,
                        std::chrono::milliseconds timeout, const std::string& timeout_key);

}  // namespace krab::elastic
