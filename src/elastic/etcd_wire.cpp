#include "elastic/etcd_wire.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <type_traits>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::elastic::etcd_wire {

using json = nlohmann::json;

namespace {

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The value of one base64 character, or -1. (Not strchr: it finds the terminating NUL too.)
int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// How deep the arrays and objects of `text` nest, counted without building them; stops
// counting past `limit`. Brackets inside strings do not count. Malformed JSON gets some
// number: the parser refuses it afterwards anyway.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size() && deepest <= limit; ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // whatever is escaped cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// A member of an answer's object that is itself an object ("header", "result"), or an empty
// object when it is absent or null.
const json& object_field(const json& object, const char* name, const std::string& where) {
  static const json kEmpty = json::object();
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return kEmpty;
  if (!it->is_object()) throw CorruptData(str_cat(where, ": field ", name, " is not an object"));
  return *it;
}

// int64 fields arrive as JSON strings (as numbers from some gateways); absent means 0. A
// number above 2^63 - 1 is refused rather than wrapped.
int64_t int64_field(const json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))
      return int64_t(it->get<uint64_t>());
  } else if (it->is_number_integer()) {
    return it->get<int64_t>();
  } else if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw CorruptData(
      str_cat(where, ": field ", name, " is not an int64: ", core::printable(it->dump(), 60)));
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
  throw CorruptData(
      str_cat(where, ": field ", name, " is not a uint64: ", core::printable(it->dump(), 60)));
}

std::string bytes_field(const json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_string()) throw CorruptData(str_cat(where, ": field ", name, " is not a string"));
  return base64_decode(it->get_ref<const std::string&>(), str_cat(where, ": field ", name));
}

// The kvs of a range answer (or of a txn's response_range).
std::vector<EtcdKeyValue> decode_kvs(const json& range, const std::string& where) {
  std::vector<EtcdKeyValue> kvs;
  const auto it = range.find("kvs");
  if (it == range.end() || it->is_null()) return kvs;
  if (!it->is_array()) throw CorruptData(str_cat(where, ": kvs is not an array"));
  kvs.reserve(it->size());
  for (const json& kv : *it) {
    if (!kv.is_object()) throw CorruptData(str_cat(where, ": a kv is not an object"));
    kvs.push_back({bytes_field(kv, "key", where), bytes_field(kv, "value", where),
                   int64_field(kv, "create_revision", where),
                   int64_field(kv, "mod_revision", where), int64_field(kv, "version", where),
                   int64_field(kv, "lease", where)});
  }
  return kvs;
}

// A field of an error answer, or `fallback` when it is absent or of another type (an int
// outside int's range included): an error answer is read for its message, and an odd one must
// not hide the failure it reports.
template <typename T>
T field_or(const json& object, const char* name, T fallback) {
  const auto it = object.find(name);
  if (it == object.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? core::printable(it->get_ref<const std::string&>()) : fallback;
  } else {
    if (!it->is_number_integer()) return fallback;
    if (it->is_number_unsigned())
      return it->get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max()) ? T(it->get<uint64_t>())
                                                                            : fallback;
    const int64_t v = it->get<int64_t>();
    return v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max() ? T(v)
                                                                                    : fallback;
  }
}

constexpr int kGrpcNotFound = 5;

}  // namespace

std::string base64_encode(std::string_view bytes) {
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

// Strict: etcd's gateway writes padded canonical base64; anything else means the answer did
// not come from etcd.
std::string base64_decode(std::string_view text, const std::string& where) {
  auto fail = [&] {
    throw CorruptData(str_cat(where, ": '", core::printable(text, 40), "' is not base64"));
  };
  if (text.size() % 4 != 0) fail();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t n = 0;
    int pad = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      const int v = base64_value(c);
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        ++pad;
      } else if (v < 0 || pad > 0) {
        fail();
      }
      n = n << 6 | uint32_t(v < 0 ? 0 : v);
    }
    // The bits below the last whole byte must be zero, or two texts would decode alike.
    if ((pad == 1 && (n & 0xff) != 0) || (pad == 2 && (n & 0xffff) != 0)) fail();
    out += char(n >> 16);
    if (pad < 2) out += char(n >> 8 & 0xff);
    if (pad < 1) out += char(n & 0xff);
  }
  return out;
}

json parse_answer(std::string_view body, int http_status, const std::string& where) {
  auto refuse = [&](const std::string& why) {
    throw CorruptData(str_cat(where, ": HTTP ", http_status, " with a body that ", why, ": '",
                              core::printable(body, 60), "'"));
  };
  if (body.size() > kMaxAnswerBytes)
    refuse(str_cat("is larger than ", kMaxAnswerBytes >> 20, " MiB"));
  if (nesting_depth(body, kMaxAnswerDepth) > kMaxAnswerDepth)
    refuse(str_cat("nests deeper than ", kMaxAnswerDepth, " levels"));
  json answer = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded() || !answer.is_object()) refuse("is not etcd's JSON");
  return answer;
}

std::optional<Refusal> decode_error(int http_status, const json& answer) {
  if (!answer.is_object()) return Refusal{http_status, 0, str_cat("HTTP ", http_status)};
  const auto error = answer.find("error");
  const bool stream_error = error != answer.end() && error->is_object();
  if (http_status == 200 && !stream_error) return std::nullopt;
  Refusal r{http_status, 0, ""};
  if (stream_error) {
    r.http_status = field_or(*error, "http_code", http_status);
    r.grpc_code = field_or(*error, "grpc_code", 0);
    r.message = field_or<std::string>(*error, "message", "");
  } else {
    r.grpc_code = field_or(answer, "code", 0);
    r.message =
        field_or<std::string>(answer, "message", field_or<std::string>(answer, "error", ""));
  }
  if (r.message.empty()) r.message = str_cat("HTTP ", http_status);
  return r;
}

void throw_refusal(const Refusal& refusal, const std::string& where, const std::string& endpoint) {
  const std::string message = str_cat(where, " at ", endpoint, ": ", refusal.message, " (HTTP ",
                                      refusal.http_status, ", gRPC code ", refusal.grpc_code, ")");
  if (refusal.grpc_code == kGrpcNotFound &&
      refusal.message.find("lease not found") != std::string::npos)
    throw PeerLost(message);
  throw Error(message);
}

std::vector<EtcdKeyValue> decode_range(const json& answer, const std::string& where) {
  return decode_kvs(answer, where);
}

int64_t decode_put(const json& answer, const std::string& where) {
  return int64_field(object_field(answer, "header", where), "revision", where);
}

int64_t decode_delete(const json& answer, const std::string& where) {
  return int64_field(answer, "deleted", where);
}

EtcdTxnResult decode_txn(const json& answer, size_t success_ops, size_t failure_ops,
                         const std::string& where) {
  EtcdTxnResult result;
  const auto succeeded = answer.find("succeeded");  // absent when false (proto3)
  if (succeeded != answer.end() && !succeeded->is_null()) {
    if (!succeeded->is_boolean())
      throw CorruptData(str_cat(
          where, ": field succeeded is not a boolean: ", core::printable(succeeded->dump(), 60)));
    result.succeeded = succeeded->get<bool>();
  }
  result.revision = int64_field(object_field(answer, "header", where), "revision", where);
  result.ranges.resize(result.succeeded ? success_ops : failure_ops);
  const auto responses = answer.find("responses");
  if (responses == answer.end() || responses->is_null()) return result;
  if (!responses->is_array())
    throw CorruptData(str_cat(where, ": field responses is not an array"));
  for (size_t i = 0; i < result.ranges.size() && i < responses->size(); ++i) {
    const json& response = (*responses)[i];
    if (!response.is_object()) throw CorruptData(str_cat(where, ": a response is not an object"));
    const auto range = response.find("response_range");
    if (range == response.end() || range->is_null()) continue;
    if (!range->is_object())
      throw CorruptData(str_cat(where, ": a response_range is not an object"));
    result.ranges[i] = decode_kvs(*range, where);
  }
  return result;
}

EtcdLease decode_grant(const json& answer, const std::string& where) {
  return {int64_field(answer, "ID", where), int64_field(answer, "TTL", where)};
}

int64_t decode_keepalive(const json& answer, const std::string& where) {
  return int64_field(object_field(answer, "result", where), "TTL", where);
}

EtcdStatus decode_status(const json& answer, const std::string& endpoint,
                         const std::string& where) {
  const json& header = object_field(answer, "header", where);
  return {endpoint, uint64_field(header, "member_id", where), uint64_field(answer, "leader", where),
          int64_field(header, "raft_term", where)};
}

}  // namespace krab::elastic::etcd_wire
