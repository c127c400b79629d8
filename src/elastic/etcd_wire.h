// The bytes of etcd's JSON gateway, both ways, without a network: the internal half of the etcd
// client (elastic/etcd_client.h holds the contract; this header is not part of it). The client
// builds its requests with base64_encode and hands every answer body it receives to the
// functions below; tests/fuzz/fuzz_etcd_answer.cpp feeds them bytes nobody sent.
//
// An answer is what an etcd member (or whatever listens on its port: a proxy, another service)
// wrote, so every decoder treats it as untrusted input. Each either returns what the answer
// says or throws CorruptData naming the call (`where`, e.g. "etcd get 'k'") and the field that
// is wrong; no other exception escapes (no nlohmann type_error, no std::out_of_range), and a
// message never quotes the answer's bytes raw (core/printable.h). What proto3 leaves out reads
// as zero, false or empty (etcd omits every field at its default), so "{}" is a valid answer to
// every call: no keys, revision 0.
//
// Bounds. parse_answer refuses a body over kMaxAnswerBytes and JSON nested deeper than
// kMaxAnswerDepth before nlohmann builds anything: etcd's deepest answer (a txn's kv) is 6
// levels, and nlohmann prints (dump) values recursively, so a forged answer a million
// levels deep would otherwise overflow the stack. Decoded keys and values are never larger
// than the body.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "elastic/etcd_client.h"

namespace krab::elastic::etcd_wire {

// Bounds of one answer (see above). The largest real answer is a prefix range over the whole
// key space; etcd's own default request limit is 1.5 MiB per value.
inline constexpr size_t kMaxAnswerBytes = size_t(256) << 20;
inline constexpr int kMaxAnswerDepth = 32;

// Standard padded base64 (RFC 4648 §4), as etcd's gateway writes every key and value.
std::string base64_encode(std::string_view bytes);
// The strict inverse of base64_encode: length a multiple of 4, only the alphabet, '=' only as
// the last one or two characters, and the unused low bits of the last group zero, so every
// text it accepts is exactly base64_encode of what it returns. Anything else is CorruptData
// "<where>: '<text, printable>' is not base64".
std::string base64_decode(std::string_view text, const std::string& where);

// The body of an answer as a JSON object. CorruptData (naming `where`, the HTTP status and the
// start of the body, printable) when it is larger or deeper than the bounds above, not JSON,
// or JSON but not an object.
nlohmann::json parse_answer(std::string_view body, int http_status, const std::string& where);

// etcd's failure answers (docs/design/elastic.md §15.6), both shapes: a unary call's
// {"error":M,"message":M,"code":N} under the failure's HTTP status, and the keepalive stream's
// {"error":{"grpc_code":N,"http_code":H,"message":M}}, possibly under HTTP 200 as the stream
// had begun. A field of another type than expected is ignored (the failure is still reported).
struct Refusal {
  int http_status = 0;
  int grpc_code = 0;
  std::string message;  // etcd's words, made printable; "HTTP <status>" when it gave none
};

// The refusal an answer reports, or nullopt when it is a success (HTTP 200 without a stream
// error). `answer` is parse_answer's result.
std::optional<Refusal> decode_error(int http_status, const nlohmann::json& answer);

// A member that answers 5xx cannot serve the request now (no leader, no quorum, leader
// changed, its own deadline); another member may. A 4xx is etcd's verdict on the request.
inline bool worth_another_member(const Refusal& r) { return r.http_status >= 500; }

// Throws the exception etcd_client.h documents for a refusal that no other member should be
// asked about: PeerLost for "lease not found" (gRPC code 5), Error otherwise; the message is
// "<where> at <endpoint>: <etcd's message> (HTTP h, gRPC code g)".
[[noreturn]] void throw_refusal(const Refusal& refusal, const std::string& where,
                                const std::string& endpoint);

// The decoders of the successful answers, one per call of EtcdClient; `answer` is
// parse_answer's result and `where` names the call in messages.
//
// /v3/kv/range: the keys found, in etcd's order.
std::vector<EtcdKeyValue> decode_range(const nlohmann::json& answer, const std::string& where);
// /v3/kv/put: header.revision.
int64_t decode_put(const nlohmann::json& answer, const std::string& where);
// /v3/kv/deleterange: how many keys were deleted.
int64_t decode_delete(const nlohmann::json& answer, const std::string& where);
// /v3/kv/txn, for a request whose branches held `success_ops` and `failure_ops` operations:
// one entry of `ranges` per op of the branch that ran (responses beyond it are ignored,
// missing ones read as empty).
EtcdTxnResult decode_txn(const nlohmann::json& answer, size_t success_ops, size_t failure_ops,
                         const std::string& where);
// /v3/lease/grant: the lease's ID and TTL.
EtcdLease decode_grant(const nlohmann::json& answer, const std::string& where);
// /v3/lease/keepalive: result.TTL (0 once the lease has expired).
int64_t decode_keepalive(const nlohmann::json& answer, const std::string& where);
// /v3/maintenance/status, from the member at `endpoint`.
EtcdStatus decode_status(const nlohmann::json& answer, const std::string& endpoint,
                         const std::string& where);

}  // namespace krab::elastic::etcd_wire
