#include "elastic/etcd_client.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <type_traits>

#include "core/errors.h"

namespace krab::elastic {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t n = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 |
                       uint8_t(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kBase64[(n >> shift) & 63];
  }
  if (i < bytes.size()) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kBase64[(n >> 18) & 63];
    out += kBase64[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Strict: etcd's gateway writes padded standard base64; anything else means the answer did
// not come from etcd.
std::string base64_decode(const std::string& text, const std::string& where) {
  auto fail = [&] {
    throw CorruptData(str_cat(where, ": '", text.substr(0, 40), "' is not base64"));
  };
  if (text.size() % 4 != 0) fail();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t n = 0;
    int pad = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      const char* at = c == '=' ? nullptr : std::strchr(kBase64, c);
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        ++pad;
      } else if (at == nullptr || c == '\0' || pad > 0) {
        fail();
      }
      n = n << 6 | (at ? uint32_t(at - kBase64) : 0);
    }
    out += char(n >> 16);
    if (pad < 2) out += char(n >> 8 & 0xff);
    if (pad < 1) out += char(n & 0xff);
  }
  return out;
}

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

// A key or value for a message: printable ASCII kept, other bytes as \xNN, at most 60 bytes.
std::string printable(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < 60; ++i) {
    const auto c = uint8_t(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (bytes.size() > 60) out += "...";
  return out;
}

// int64 fields arrive as JSON strings (as numbers from some gateways); absent means 0.
int64_t int64_field(const json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw CorruptData(str_cat(where, ": field ", name, " is not an int64: ", it->dump()));
}

// Member IDs are uint64s (often above 2^63), as strings.
uint64_t uint64_field(const json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw CorruptData(str_cat(where, ": field ", name, " is not a uint64: ", it->dump()));
}

std::string bytes_field(const json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_string()) throw CorruptData(str_cat(where, ": field ", name, " is not a string"));
  return base64_decode(it->get_ref<const std::string&>(), str_cat(where, ": field ", name));
}

std::vector<EtcdKeyValue> decode_kvs(const json& range, const std::string& where) {
  std::vector<EtcdKeyValue> kvs;
  const auto it = range.find("kvs");
  if (it == range.end()) return kvs;
  if (!it->is_array()) throw CorruptData(str_cat(where, ": kvs is not an array"));
  for (const json& kv : *it) {
    if (!kv.is_object()) throw CorruptData(str_cat(where, ": a kv is not an object"));
    kvs.push_back({bytes_field(kv, "key", where), bytes_field(kv, "value", where),
                   int64_field(kv, "create_revision", where),
                   int64_field(kv, "mod_revision", where), int64_field(kv, "version", where),
                   int64_field(kv, "lease", where)});
  }
  return kvs;
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
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    answer.body.append(data, n);
    return true;
  };
  answer.error = client.send(req).error();
  if (answer.error == httplib::Error::Read && trailer && answer.status != 0 &&
      json::accept(answer.body))
    answer.error = httplib::Error::Success;
  return answer;
}

// etcd's failure answers, both shapes (§15.6): unary calls send {"error":M,"message":M,"code":N}
// with the HTTP status; the keepalive stream sends {"error":{"grpc_code":N,"http_code":H,
// "message":M}}, possibly under HTTP 200 as the stream had begun.
struct Refusal {
  int http_status = 0;
  int grpc_code = 0;
  std::string message;
};

// A field of an error answer, or `fallback` when it is absent or of another type: an error
// answer is read for its message, and an odd one must not hide the failure it reports.
template <typename T>
T field_or(const json& object, const char* name, T fallback) {
  const auto it = object.find(name);
  if (it == object.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->get<std::string>() : fallback;
  } else {
    return it->is_number_integer() ? it->get<T>() : fallback;
  }
}

std::optional<Refusal> refusal_of(int status, const json& body) {
  const auto error = body.find("error");
  const bool stream_error = error != body.end() && error->is_object();
  if (status == 200 && !stream_error) return std::nullopt;
  Refusal r{status, 0, ""};
  if (stream_error) {
    r.http_status = field_or(*error, "http_code", status);
    r.grpc_code = field_or(*error, "grpc_code", 0);
    r.message = field_or<std::string>(*error, "message", "");
  } else {
    r.grpc_code = field_or(body, "code", 0);
    r.message = field_or<std::string>(body, "message", field_or<std::string>(body, "error", ""));
  }
  if (r.message.empty()) r.message = str_cat("HTTP ", status);
  return r;
}

// A member that answers 5xx cannot serve the request now (no leader, no quorum, leader
// changed, its own deadline); another member may. A 4xx is etcd's verdict on the request.
bool worth_another_member(const Refusal& r) { return r.http_status >= 500; }

constexpr int kGrpcNotFound = 5;

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
  const std::string what = key.empty() ? op : str_cat(op, " '", printable(key), "'");
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
      const json answer = json::parse(res.body, nullptr, /*allow_exceptions=*/false);
      if (answer.is_discarded() || !answer.is_object())
        throw CorruptData(str_cat("etcd ", what, " at ", endpoint, ": HTTP ", res.status,
                                  " with a body that is not etcd's JSON: '", printable(res.body),
                                  "'"));
      const std::optional<Refusal> refusal = refusal_of(res.status, answer);
      if (!refusal) {
        current = i;
        return answer;
      }
      if (worth_another_member(*refusal)) {
        last_error[i] =
            str_cat("etcd says '", refusal->message, "' (HTTP ", refusal->http_status, ")");
        continue;
      }
      const std::string message =
          str_cat("etcd ", what, " at ", endpoint, ": ", refusal->message, " (HTTP ",
                  refusal->http_status, ", gRPC code ", refusal->grpc_code, ")");
      if (refusal->grpc_code == kGrpcNotFound &&
          refusal->message.find("lease not found") != std::string::npos)
        throw PeerLost(message);
      throw Error(message);
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
  return int64_field(answer.value("header", json::object()), "revision", "etcd put");
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key) {
  KRAB_CHECK_ARG(!key.empty(), "etcd get: the key is empty");
  const json answer = impl_->call("get", key, "/v3/kv/range", range_request(key, false));
  std::vector<EtcdKeyValue> kvs = decode_kvs(answer, "etcd get");
  if (kvs.empty()) return std::nullopt;
  return std::move(kvs.front());
}

std::vector<EtcdKeyValue> EtcdClient::get_prefix(const std::string& prefix) {
  const json answer =
      impl_->call("get prefix", prefix, "/v3/kv/range", range_request(prefix, true));
  return decode_kvs(answer, "etcd get prefix");
}

int64_t EtcdClient::erase(const std::string& key) {
  KRAB_CHECK_ARG(!key.empty(), "etcd delete: the key is empty");
  const json answer = impl_->call("delete", key, "/v3/kv/deleterange", range_request(key, false));
  return int64_field(answer, "deleted", "etcd delete");
}

int64_t EtcdClient::erase_prefix(const std::string& prefix) {
  const json answer =
      impl_->call("delete prefix", prefix, "/v3/kv/deleterange", range_request(prefix, true));
  return int64_field(answer, "deleted", "etcd delete prefix");
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

  EtcdTxnResult result;
  const auto succeeded = answer.find("succeeded");  // absent when false (proto3)
  if (succeeded != answer.end() && !succeeded->is_boolean())
    throw CorruptData(str_cat("etcd txn: field succeeded is not a boolean: ", succeeded->dump()));
  result.succeeded = succeeded != answer.end() && succeeded->get<bool>();
  result.revision = int64_field(answer.value("header", json::object()), "revision", "etcd txn");
  const std::vector<EtcdOp>& ran = result.succeeded ? success : failure;
  result.ranges.resize(ran.size());
  const json responses = answer.value("responses", json::array());
  if (!responses.is_array()) throw CorruptData("etcd txn: field responses is not an array");
  for (size_t i = 0; i < ran.size() && i < responses.size(); ++i) {
    const auto range = responses[i].find("response_range");
    if (range != responses[i].end()) result.ranges[i] = decode_kvs(*range, "etcd txn");
  }
  return result;
}

EtcdLease EtcdClient::grant(int64_t ttl_s) {
  KRAB_CHECK_ARG(ttl_s >= 1, "etcd lease grant: TTL ", ttl_s, " s is below 1 s");
  const json answer =
      impl_->call("lease grant", "", "/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}});
  return {int64_field(answer, "ID", "etcd lease grant"),
          int64_field(answer, "TTL", "etcd lease grant")};
}

int64_t EtcdClient::keepalive(int64_t lease) {
  // A stream on the gRPC side: the gateway answers our one request with one {"result":...}.
  // An expired lease's result simply has no TTL.
  const json answer = impl_->call(str_cat("lease keepalive ", lease), "", "/v3/lease/keepalive",
                                  {{"ID", std::to_string(lease)}});
  return int64_field(answer.value("result", json::object()), "TTL", "etcd lease keepalive");
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
  const json header = answer.value("header", json::object());
  return {current_endpoint(), uint64_field(header, "member_id", "etcd status"),
          uint64_field(answer, "leader", "etcd status"),
          int64_field(header, "raft_term", "etcd status")};
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
