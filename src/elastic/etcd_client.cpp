#include "elastic/etcd_client.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/errors.h"
#include "core/printable.h"
#include "elastic/etcd_wire.h"

namespace krab::elastic {

using json = nlohmann::json;
using etcd_wire::base64_encode;
using Clock = std::chrono::steady_clock;

namespace {

// The range_end that selects every key starting with `prefix`: the prefix with its last byte
// below 0xff incremented and what follows dropped. A prefix of only 0xff bytes (or an empty
// one) has no such bound: "\0" means "to the end of the key space" to etcd.
std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && uint8_t(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = char(uint8_t(end.back()) + 1);
  return end;
}

// etcd refuses an empty key; every key is the range from "\0" to "\0" (the end of the space).
json range_request(const std::string& key, bool prefix) {
  if (prefix && key.empty()) {
    const std::string zero(1, '\0');
    return {{"key", base64_encode(zero)}, {"range_end", base64_encode(zero)}};
  }
  json r = {{"key", base64_encode(key)}};
  if (prefix) r["range_end"] = base64_encode(prefix_end(key));
  return r;
}

json op_request(const EtcdOp& op) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut: {
      json put = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease != 0) put["lease"] = std::to_string(op.lease);
      return {{"request_put", put}};
    }
    case EtcdOp::Kind::kGet:
      return {{"request_range", range_request(op.key, op.prefix)}};
    case EtcdOp::Kind::kDelete:
      return {{"request_delete_range", range_request(op.key, op.prefix)}};
  }
  KRAB_CHECK(false, "unknown EtcdOp kind");
}

json compare_request(const EtcdCompare& c) {
  json r = {{"key", base64_encode(c.key)}, {"result", "EQUAL"}};
  switch (c.target) {
    case EtcdCompare::Target::kValue:
      r["target"] = "VALUE";
      r["value"] = base64_encode(c.value);
      break;
    case EtcdCompare::Target::kCreateRevision:
      r["target"] = "CREATE";
      r["create_revision"] = std::to_string(c.revision);
      break;
    case EtcdCompare::Target::kModRevision:
      r["target"] = "MOD";
      r["mod_revision"] = std::to_string(c.revision);
      break;
  }
  return r;
}

// "host:port" split for httplib; a bracketed IPv6 host loses its brackets.
std::pair<std::string, int> split_endpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, std::stoi(endpoint.substr(colon + 1))};
}

std::string describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "cannot connect (refused or unreachable)";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out";
    case httplib::Error::Read:
      return "no answer (the connection closed or the read timed out)";
    case httplib::Error::Write:
      return "cannot send the request";
    default:
      return httplib::to_string(error);
  }
}

// One POST to one endpoint. httplib 0.11 cannot read the HTTP trailer that etcd's gateway
// sends after every failure answer (`Trailer: Grpc-Trailer-Content-Type`, chunked): it reports
// a read error although status and body had arrived whole. So the status comes through the
// response handler and the body through a content receiver, and a read error after a declared
// trailer counts as success when the body parses (a truncated body does not).
struct Answer {
  httplib::Error error = httplib::Error::Unknown;
  int status = 0;
  std::string body;
};

Answer post(httplib::Client& client, const std::string& path, const std::string& body) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.headers = {{"Content-Type", "application/json"}};
  Answer answer;
  bool trailer = false;
  req.response_handler = [&](const httplib::Response& r) {
    answer.status = r.status;
    trailer = r.has_header("Trailer");
    return true;
  };
  // An answer is kept up to one byte past etcd_wire's bound, and then the read stops:
  // parse_answer refuses it as too large (whoever sends it is no etcd member).
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    answer.body.append(data, std::min(n, etcd_wire::kMaxAnswerBytes + 1 - answer.body.size()));
    return answer.body.size() <= etcd_wire::kMaxAnswerBytes;
  };
  answer.error = client.send(req).error();
  if (answer.body.size() > etcd_wire::kMaxAnswerBytes) answer.error = httplib::Error::Success;
  if (answer.error == httplib::Error::Read && trailer && answer.status != 0 &&
      json::accept(answer.body))
    answer.error = httplib::Error::Success;
  return answer;
}

}  // namespace

EtcdCompare EtcdCompare::absent(std::string key) {
  return {Target::kCreateRevision, std::move(key), {}, 0};
}
EtcdCompare EtcdCompare::value_is(std::string key, std::string value) {
  return {Target::kValue, std::move(key), std::move(value), 0};
}
EtcdCompare EtcdCompare::mod_revision_is(std::string key, int64_t revision) {
  return {Target::kModRevision, std::move(key), {}, revision};
}

EtcdOp EtcdOp::put(std::string key, std::string value, int64_t lease) {
  return {Kind::kPut, std::move(key), std::move(value), lease, false};
}
EtcdOp EtcdOp::get(std::string key) { return {Kind::kGet, std::move(key), {}, 0, false}; }
EtcdOp EtcdOp::get_prefix(std::string prefix) {
  return {Kind::kGet, std::move(prefix), {}, 0, true};
}
EtcdOp EtcdOp::erase(std::string key) { return {Kind::kDelete, std::move(key), {}, 0, false}; }

std::vector<std::string> EtcdClient::parse_endpoints(const std::string& list,
                                                     const std::string& what) {
  std::vector<std::string> endpoints;
  size_t begin = 0;
  while (true) {
    const size_t comma = list.find(',', begin);
    const std::string item = list.substr(begin, comma - begin);
    const size_t colon = item.rfind(':');
    KRAB_CHECK_ARG(colon != std::string::npos && colon > 0, what, " ", list, ": '", item,
                   "' is not HOST:PORT");
    const std::string port = item.substr(colon + 1);
    int p = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    KRAB_CHECK_ARG(!port.empty() && ec == std::errc() && end == port.data() + port.size() &&
                       p >= 1 && p <= 65535,
                   what, " ", list, ": '", item, "' has no port in 1..65535");
    endpoints.push_back(item);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return endpoints;
}

struct EtcdClient::Impl {
  Options options;
  std::vector<std::unique_ptr<httplib::Client>> clients;  // one per endpoint, kept alive
  size_t current = 0;                                     // the endpoint tried first
  mutable std::mutex mu;                                  // one call at a time

  json call(const std::string& op, const std::string& key, const std::string& path,
            const json& request);
};

// The fail-over loop of the header: the current endpoint first, then the others in order,
// round after round with a short pause between rounds, until the call's deadline.
json EtcdClient::Impl::call(const std::string& op, const std::string& key, const std::string& path,
                            const json& request) {
  std::lock_guard<std::mutex> lock(mu);
  const std::string what = key.empty() ? op : str_cat(op, " '", core::printable(key, 60), "'");
  const std::string body = request.dump();
  const size_t n = clients.size();
  std::vector<std::string> last_error(n, "not tried");
  const auto deadline = Clock::now() + options.timeout;
  auto pause = std::chrono::milliseconds(20);
  while (true) {
    const size_t first = current;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (first + k) % n;
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      const auto bound = std::min<std::chrono::microseconds>(left, options.attempt_timeout);
      httplib::Client& client = *clients[i];
      client.set_connection_timeout(bound);
      client.set_read_timeout(bound);
      client.set_write_timeout(bound);
      const Answer res = post(client, path, body);
      const std::string& endpoint = options.endpoints[i];
      if (res.error != httplib::Error::Success) {
        last_error[i] = describe(res.error);
        continue;
      }
      json answer =
          etcd_wire::parse_answer(res.body, res.status, str_cat("etcd ", what, " at ", endpoint));
      const std::optional<etcd_wire::Refusal> refusal = etcd_wire::decode_error(res.status, answer);
      if (!refusal) {
        current = i;
        return answer;
      }
      if (etcd_wire::worth_another_member(*refusal)) {
        last_error[i] =
            str_cat("etcd says '", refusal->message, "' (HTTP ", refusal->http_status, ")");
        continue;
      }
      etcd_wire::throw_refusal(*refusal, str_cat("etcd ", what), endpoint);
    }
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      std::string tried;
      for (size_t i = 0; i < n; ++i)
        tried += str_cat(i ? "; " : "", options.endpoints[i], ": ", last_error[i]);
      throw Timeout(str_cat("etcd ", what, ": no endpoint answered within ",
                            options.timeout.count() / 1000.0, " s (", tried, ")"));
    }
    // Every endpoint failed fast (refused, or no quorum yet): give a restarting member or an
    // election a moment instead of spinning, never past the deadline.
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, left));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

EtcdClient::EtcdClient(Options options) : impl_(std::make_unique<Impl>()) {
  KRAB_CHECK_ARG(!options.endpoints.empty(), "EtcdClient: no endpoints given");
  KRAB_CHECK_ARG(options.timeout.count() > 0 && options.attempt_timeout.count() > 0,
                 "EtcdClient: timeouts must be positive");
  for (const std::string& endpoint : options.endpoints) {
    parse_endpoints(endpoint, "EtcdClient endpoint");  // one item: validates it
    const auto [host, port] = split_endpoint(endpoint);
    auto client = std::make_unique<httplib::Client>(host, port);
    client->set_keep_alive(true);
    // Without it every request after the first on a kept-alive connection waits ~45 ms for
    // the peer's delayed ACK (Nagle; §15.6).
    client->set_tcp_nodelay(true);
    impl_->clients.push_back(std::move(client));
  }
  impl_->options = std::move(options);
}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::current_endpoint() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->options.endpoints[impl_->current];
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  KRAB_CHECK_ARG(!key.empty(), "etcd put: the key is empty");
  json request = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) request["lease"] = std::to_string(lease);
  const json answer = impl_->call("put", key, "/v3/kv/put", request);
  return etcd_wire::decode_put(answer, "etcd put");
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key) {
  KRAB_CHECK_ARG(!key.empty(), "etcd get: the key is empty");
  const json answer = impl_->call("get", key, "/v3/kv/range", range_request(key, false));
  std::vector<EtcdKeyValue> kvs = etcd_wire::decode_range(answer, "etcd get");
  if (kvs.empty()) return std::nullopt;
  return std::move(kvs.front());
}

std::vector<EtcdKeyValue> EtcdClient::get_prefix(const std::string& prefix) {
  const json answer =
      impl_->call("get prefix", prefix, "/v3/kv/range", range_request(prefix, true));
  return etcd_wire::decode_range(answer, "etcd get prefix");
}

int64_t EtcdClient::erase(const std::string& key) {
  KRAB_CHECK_ARG(!key.empty(), "etcd delete: the key is empty");
  const json answer = impl_->call("delete", key, "/v3/kv/deleterange", range_request(key, false));
  return etcd_wire::decode_delete(answer, "etcd delete");
}

int64_t EtcdClient::erase_prefix(const std::string& prefix) {
  const json answer =
      impl_->call("delete prefix", prefix, "/v3/kv/deleterange", range_request(prefix, true));
  return etcd_wire::decode_delete(answer, "etcd delete prefix");
}

EtcdTxnResult EtcdClient::txn(const std::vector<EtcdCompare>& compare,
                              const std::vector<EtcdOp>& success,
                              const std::vector<EtcdOp>& failure) {
  json request = {
      {"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const EtcdCompare& c : compare) {
    KRAB_CHECK_ARG(!c.key.empty(), "etcd txn: a comparison has an empty key");
    request["compare"].push_back(compare_request(c));
  }
  for (const EtcdOp& op : success) request["success"].push_back(op_request(op));
  for (const EtcdOp& op : failure) request["failure"].push_back(op_request(op));
  const std::string first_key = compare.empty() ? std::string() : compare.front().key;
  const json answer = impl_->call("txn", first_key, "/v3/kv/txn", request);
  return etcd_wire::decode_txn(answer, success.size(), failure.size(), "etcd txn");
}

EtcdLease EtcdClient::grant(int64_t ttl_s) {
  KRAB_CHECK_ARG(ttl_s >= 1, "etcd lease grant: TTL ", ttl_s, " s is below 1 s");
  const json answer =
      impl_->call("lease grant", "", "/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}});
  return etcd_wire::decode_grant(answer, "etcd lease grant");
}

int64_t EtcdClient::keepalive(int64_t lease) {
  // A stream on the gRPC side: the gateway answers our one request with one {"result":...}.
  // An expired lease's result simply has no TTL.
  const json answer = impl_->call(str_cat("lease keepalive ", lease), "", "/v3/lease/keepalive",
                                  {{"ID", std::to_string(lease)}});
  return etcd_wire::decode_keepalive(answer, "etcd lease keepalive");
}

bool EtcdClient::revoke(int64_t lease) {
  try {
    impl_->call(str_cat("lease revoke ", lease), "", "/v3/lease/revoke",
                {{"ID", std::to_string(lease)}});
    return true;
  } catch (const PeerLost&) {
    return false;  // "requested lease not found": it ended before this call
  }
}

EtcdStatus EtcdClient::status() {
  const json answer = impl_->call("status", "", "/v3/maintenance/status", json::object());
  return etcd_wire::decode_status(answer, current_endpoint(), "etcd status");
}

EtcdStatus require_etcd(const std::string& flag, const std::string& list,
                        std::chrono::milliseconds timeout, const std::string& timeout_key) {
  EtcdClient::Options options;
  options.endpoints = EtcdClient::parse_endpoints(list, flag);
  options.timeout = timeout;
  options.attempt_timeout = std::min(options.attempt_timeout, timeout);
  EtcdClient client(std::move(options));
  try {
    return client.status();
  } catch (const Timeout& e) {
    throw InvalidArgument(str_cat(flag, " ", list, ": no etcd answered within ",
                                  timeout.count() / 1000.0, " s (", timeout_key, ") [", e.what(),
                                  "]"));
  }
}

}  // namespace krab::elastic
