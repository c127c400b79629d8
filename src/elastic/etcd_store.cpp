#include "elastic/etcd_store.h"

#include <c10/util/hash.h>

#include <charconv>
#include <thread>

#include "core/errors.h"
#include "core/printable.h"
#include "elastic/etcd_client.h"

namespace krab::elastic {
namespace {

std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// add()'s counter as TCPStore keeps it: decimal text. Anything else under the key is not a
// counter another add() wrote.
int64_t counter_of(const std::string& key, const std::string& value) {
  int64_t n = 0;
  const char* last = value.data() + value.size();
  const auto [end, ec] = std::from_chars(value.data(), last, n);
  if (ec != std::errc() || end != last)
    throw CorruptData(str_cat("etcd key ", core::printable_text(key), " holds '",
                              core::printable_text(value.substr(0, 32)), "', not a counter"));
  return n;
}

}  // namespace

std::string etcd_job_prefix(const std::string& secret) {
  if (secret.empty()) return "/krab/open/";
  return "/krab/" + c10::sha1("krab rendezvous prefix\n" + secret).str() + "/";
}

EtcdStore::EtcdStore(std::shared_ptr<EtcdClient> client, std::string prefix,
                     std::chrono::milliseconds timeout)
    : c10d::Store(timeout), client_(std::move(client)), prefix_(std::move(prefix)) {
  KRAB_CHECK(client_ != nullptr, "EtcdStore: no client");
}

EtcdStore::~EtcdStore() = default;

void EtcdStore::fence(std::string key, std::string value) {
  fence_ = std::make_pair(std::move(key), std::move(value));
}

std::optional<std::string> EtcdStore::read(const std::string& key) {
  std::optional<EtcdKeyValue> kv = client_->get(full(key));
  if (!kv) return std::nullopt;
  return std::move(kv->value);
}

void EtcdStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  if (!fence_) {
    client_->put(full(key), text(value));
    return;
  }
  const EtcdTxnResult r = client_->txn({EtcdCompare::value_is(fence_->first, fence_->second)},
                                       {EtcdOp::put(full(key), text(value))}, {});
  if (!r.succeeded)
    throw PeerLost(
        str_cat("etcd: ", core::printable_text(fence_->first),
                " no longer names this agent: it is not the leader, and writes nothing"));
}

std::vector<uint8_t> EtcdStore::compareSet(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  std::vector<EtcdCompare> compare{expected.empty()
                                       ? EtcdCompare::absent(full(key))
                                       : EtcdCompare::value_is(full(key), text(expected))};
  if (fence_) compare.push_back(EtcdCompare::value_is(fence_->first, fence_->second));
  const EtcdTxnResult r =
      client_->txn(compare, {EtcdOp::put(full(key), text(desired))}, {EtcdOp::get(full(key))});
  if (r.succeeded) return desired;
  if (fence_ &&
      !client_->txn({EtcdCompare::value_is(fence_->first, fence_->second)}, {}, {}).succeeded)
    throw PeerLost(
        str_cat("etcd: ", core::printable_text(fence_->first),
                " no longer names this agent: it is not the leader, and writes nothing"));
  if (r.ranges.empty() || r.ranges[0].empty()) return expected;  // absent: as TCPStore answers
  return bytes(r.ranges[0][0].value);
}

std::vector<uint8_t> EtcdStore::get(const std::string& key) {
  wait({key});
  std::optional<std::string> v = read(key);
  if (!v) throw Timeout(str_cat("etcd key ", core::printable_text(key), " vanished while read"));
  return bytes(*v);
}

int64_t EtcdStore::add(const std::string& key, int64_t value) {
  for (;;) {
    std::optional<EtcdKeyValue> kv = client_->get(full(key));
    const int64_t now = kv ? counter_of(key, kv->value) + value : value;
    std::vector<EtcdCompare> compare{
        EtcdCompare::mod_revision_is(full(key), kv ? kv->mod_revision : 0)};
    if (fence_) compare.push_back(EtcdCompare::value_is(fence_->first, fence_->second));
    if (client_->txn(compare, {EtcdOp::put(full(key), std::to_string(now))}, {}).succeeded)
      return now;
    if (fence_ &&
        !client_->txn({EtcdCompare::value_is(fence_->first, fence_->second)}, {}, {}).succeeded)
      throw PeerLost(str_cat("etcd: ", core::printable_text(fence_->first),
                             " no longer names this agent: it is not the leader"));
    // Another writer moved the counter between our read and our write: read it again.
  }
}

bool EtcdStore::deleteKey(const std::string& key) {
  if (!fence_) return client_->erase(full(key)) > 0;
  const EtcdTxnResult r = client_->txn({EtcdCompare::value_is(fence_->first, fence_->second)},
                                       {EtcdOp::get(full(key)), EtcdOp::erase(full(key))}, {});
  if (!r.succeeded)
    throw PeerLost(str_cat("etcd: ", core::printable_text(fence_->first),
                           " no longer names this agent: it is not the leader"));
  return !r.ranges.empty() && !r.ranges[0].empty();
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const std::string& k : keys)
    if (!client_->get(full(k))) return false;
  return true;
}

int64_t EtcdStore::getNumKeys() {
  return static_cast<int64_t>(client_->get_prefix(prefix_).size());
}

void EtcdStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void EtcdStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string names;
      for (const std::string& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw Timeout(str_cat("etcd: no ", core::printable_text(names), " under ",
                            core::printable_text(prefix_), " within ", timeout.count() / 1000.0,
                            " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace krab::elastic
