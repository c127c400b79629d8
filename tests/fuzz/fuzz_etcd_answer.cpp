// Fuzzes the etcd client's reading of an answer (elastic/etcd_wire.h): the bytes an etcd
// member's JSON gateway (or whatever listens on its port) sends back, which the client turns
// into keys, values, revisions, leases and refusals. Every input runs the path of one call:
// parse_answer, decode_error, then throw_refusal for a refusal or every call's decoder for a
// success, each of which may only return or throw a krab::Error with a printable message; and
// the base64 decoder on the raw bytes, which must accept only what base64_encode gives back.
//
// Input: byte 0 picks the HTTP status (200, 400, 404, 500, 503), byte 1 the size of a txn's
// two branches (low nibble: success ops, high nibble: failure ops), the rest is the body.
// The seeds (corpus/fuzz_etcd_answer/) are real answers of etcd 3.4.23, captured by
// capture_etcd_seeds.sh.
#include <string>
#include <string_view>

#include "elastic/etcd_wire.h"
#include "fuzz/fuzz_util.h"

namespace wire = krab::elastic::etcd_wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static constexpr int kStatuses[] = {200, 400, 404, 500, 503};
  const int status = kStatuses[data[0] % 5];
  const size_t success_ops = data[1] & 15, failure_ops = data[1] >> 4;
  const std::string_view body(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::string where = "etcd fuzz";

  krab::fuzz::refusals_only([&] {
    const std::string bytes = wire::base64_decode(body, where);
    krab::fuzz::check(wire::base64_encode(bytes) == body,
                      "accepted base64 does not encode back to its own text");
  });

  nlohmann::json answer;
  bool parsed = false;
  krab::fuzz::refusals_only([&] {
    answer = wire::parse_answer(body, status, where);
    parsed = true;
  });
  if (!parsed) return 0;
  krab::fuzz::check(answer.is_object(), "parse_answer returned JSON that is not an object");

  std::optional<wire::Refusal> refusal;
  krab::fuzz::refusals_only([&] { refusal = wire::decode_error(status, answer); });
  krab::fuzz::check(refusal.has_value() || status == 200, "a non-200 answer read as a success");
  if (refusal) {
    krab::fuzz::check(!refusal->message.empty(), "a refusal without a message");
    krab::fuzz::refusals_only([&] { wire::throw_refusal(*refusal, where, "127.0.0.1:2379"); });
    return 0;
  }
  krab::fuzz::refusals_only([&] { wire::decode_range(answer, where); });
  krab::fuzz::refusals_only([&] { wire::decode_put(answer, where); });
  krab::fuzz::refusals_only([&] { wire::decode_delete(answer, where); });
  krab::fuzz::refusals_only([&] {
    const auto txn = wire::decode_txn(answer, success_ops, failure_ops, where);
    krab::fuzz::check(txn.ranges.size() == (txn.succeeded ? success_ops : failure_ops),
                      "a txn result without one range per op of the branch that ran");
  });
  krab::fuzz::refusals_only([&] { wire::decode_grant(answer, where); });
  krab::fuzz::refusals_only([&] { wire::decode_keepalive(answer, where); });
  krab::fuzz::refusals_only([&] { wire::decode_status(answer, "127.0.0.1:2379", where); });
  return 0;
}
