#include "elastic/etcd_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "core/errors.h"
#include "elastic/etcd_client.h"
#include "elastic/etcd_election.h"
#include "elastic/etcd_store.h"

namespace krab::elastic {
namespace {

EtcdClient::Options client_options(const EtcdRendezvousOptions& o) {
  EtcdClient::Options c;
  c.endpoints = EtcdClient::parse_endpoints(o.endpoints, "--rdzv-endpoints");
  c.timeout = o.timeout;
  return c;
}

std::string random_id() {
  std::random_device rd;
  std::string id;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) id += kHex[rd() % 16];
  return id;
}

}  // namespace

std::string etcd_run_prefix(const std::string& secret, const std::string& run) {
  return etcd_job_prefix(secret) + "runs/" + run + "/";
}

EtcdRendezvous::EtcdRendezvous(const EtcdRendezvousOptions& options)
    : options_(options),
      client_(std::make_shared<EtcdClient>(client_options(options))),
      lease_client_(std::make_unique<EtcdClient>(client_options(options))) {
  const int64_t ttl = std::max<int64_t>(2, std::llround(options_.lease_s));
  lease_ = client_->grant(ttl).id;
  const std::string run_key = etcd_job_prefix(options_.secret) + "run";
  if (options_.node == 0) {
    run_ = random_id();
    client_->put(run_key, run_, lease_);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
      if (std::optional<EtcdKeyValue> kv = client_->get(run_key)) {
        run_ = kv->value;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw Timeout(str_cat("--rdzv-endpoints ", options_.endpoints,
                              ": no run of this job (node 0 with the same job secret) appeared "
                              "within ",
                              options_.timeout.count() / 1000.0, " s (comm.timeout_s)"));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  prefix_ = etcd_run_prefix(options_.secret, run_);
  client_->put(str_cat(prefix_, "nodes/", options_.node), "alive", lease_);
  store_ = c10::make_intrusive<EtcdStore>(client_, prefix_, options_.timeout);
  auto fenced = c10::make_intrusive<EtcdStore>(client_, prefix_, options_.timeout);
  fenced->fence(prefix_ + "leader", str_cat("node ", options_.node, " lease ", lease_));
  fenced_ = fenced;
  renewer_ = std::thread([this] { renew(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  stop_ = true;
  renewer_.join();
  try {
    client_->revoke(lease_);         // its keys (the node, the leadership, node 0's run) go now
  } catch (const std::exception&) {  // etcd unreachable: they expire with the lease
  }
}

// Renews the lease often enough that a renewal sent first to a member that vanished with its
// machine (no refusal comes back: the client waits out attempt_timeout, 3 s, before the next
// member) still lands within the TTL: every (TTL - attempt_timeout) / 2, at most TTL / 3, at
// least 200 ms; 1 s for the default 5 s. Every TTL / 3 (1.67 s) left 0.33 s for the next
// member to answer, and a live machine lost its lease when node 0's machine took the member it
// talked to down (tests/net/elastic_etcd.sh). A renewal that finds the lease gone ends them.
void EtcdRendezvous::renew() {
  const int64_t ttl_ms = 1000 * std::max<int64_t>(2, std::llround(options_.lease_s));
  const int64_t attempt_ms = client_options(options_).attempt_timeout.count();
  const auto period = std::chrono::milliseconds(
      std::max<int64_t>(200, std::min(ttl_ms / 3, (ttl_ms - attempt_ms) / 2)));
  auto next = std::chrono::steady_clock::now() + period;
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (std::chrono::steady_clock::now() < next) continue;
    next = std::chrono::steady_clock::now() + period;
    try {
      if (lease_client_->keepalive(lease_) == 0) {
        lease_alive_ = false;
        return;
      }
    } catch (const std::exception&) {  // no member answered this time: the TTL decides
    }
  }
}

bool EtcdRendezvous::campaign() {
  EtcdElection election(*client_, prefix_ + "leader");
  return election.campaign(str_cat("node ", options_.node, " lease ", lease_), lease_).won;
}

bool EtcdRendezvous::leader_present() { return client_->get(prefix_ + "leader").has_value(); }

std::vector<int> EtcdRendezvous::live_nodes() {
  std::vector<int> nodes;
  const std::string dir = prefix_ + "nodes/";
  for (const EtcdKeyValue& kv : client_->get_prefix(dir)) {
    try {
      nodes.push_back(std::stoi(kv.key.substr(dir.size())));
    } catch (const std::exception&) {  // not a node number: not ours
    }
  }
  return nodes;
}

void EtcdRendezvous::publish_rendezvous(const comm::Endpoint& at) {
  const std::string text = str_cat(at.host, ":", at.port);
  store_->set("rdzv", std::vector<uint8_t>(text.begin(), text.end()));
}

comm::Endpoint EtcdRendezvous::wait_rendezvous(std::chrono::milliseconds timeout) {
  store_->wait({"rdzv"}, timeout);
  const std::vector<uint8_t> v = store_->get("rdzv");
  return comm::parse_endpoint(std::string(v.begin(), v.end()), "node 0's rendezvous in etcd");
}

}  // namespace krab::elastic
