// elastic/etcd_wire.h without a network: real answers of etcd 3.4.23 (the fuzz target's seeds,
// tests/fuzz/corpus/fuzz_etcd_answer/) decode to what etcd stored, and the answers that
// fuzz_etcd_answer found mishandled are refused with a krab exception and a printable message.
#include "elastic/etcd_wire.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "core/errors.h"

namespace krab::elastic::etcd_wire {
namespace {

const std::string kHeader =
    R"("header":{"cluster_id":"7009806451448927132","member_id":"14504840459477854813",)"
    R"("revision":"4","raft_term":"2"})";

nlohmann::json ok(const std::string& body) { return parse_answer(body, 200, "test"); }

TEST(EtcdWire, Base64RoundTripsEveryByteAndLength) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += char(i);
  for (size_t n = 0; n <= 7; ++n) {
    const std::string part = bytes.substr(250 - n, n);  // ends in 0xff
    EXPECT_EQ(base64_decode(base64_encode(part), "t"), part) << n;
  }
  EXPECT_EQ(base64_decode(base64_encode(bytes), "t"), bytes);
  EXPECT_EQ(base64_encode(std::string_view("agent-0\0\xff", 9)),
            "YWdlbnQtMAD/");  // as etcd sent it
}

TEST(EtcdWire, Base64RefusesWhatEtcdNeverWrites) {
  for (const char* text : {"QQ=", "Q===", "QQ=A", "QR==", "QUI=QQ==", "QUJ=", "Q\x01=="}) {
    try {
      base64_decode(text, "etcd get: field key");
      ADD_FAILURE() << "accepted " << text;
    } catch (const CorruptData& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\x01'), std::string::npos) << what;  // quoted printable
      EXPECT_NE(what.find("field key"), std::string::npos) << what;
    }
  }
}

TEST(EtcdWire, RangeAndTxnAnswersOfEtcd34) {
  const auto kvs = decode_range(
      ok("{" + kHeader +
         R"(,"kvs":[{"key":"am9iL2xlYWRlcg==","create_revision":"2","mod_revision":"3",)"
         R"("version":"2","value":"YWdlbnQtMAD/","lease":"6776688527439907085"}],"count":"1"})"),
      "test");
  ASSERT_EQ(kvs.size(), 1u);
  EXPECT_EQ(kvs[0].key, "job/leader");
  EXPECT_EQ(kvs[0].value, std::string("agent-0\0\xff", 9));
  EXPECT_EQ(kvs[0].create_revision, 2);
  EXPECT_EQ(kvs[0].mod_revision, 3);
  EXPECT_EQ(kvs[0].version, 2);
  EXPECT_EQ(kvs[0].lease, 6776688527439907085);
  EXPECT_TRUE(decode_range(ok("{" + kHeader + "}"), "test").empty());  // a miss

  // A failed txn (no "succeeded") whose failure branch was one range.
  const auto txn = decode_txn(
      ok("{" + kHeader +
         R"(,"responses":[{"response_range":{"header":{"revision":"4"},"kvs":[)"
         R"({"key":"am9iL2xlYWRlcg==","create_revision":"2","mod_revision":"2","version":"1",)"
         R"("value":"YWdlbnQtMA=="}],"count":"1"}}]})"),
      1, 1, "test");
  EXPECT_FALSE(txn.succeeded);
  EXPECT_EQ(txn.revision, 4);
  ASSERT_EQ(txn.ranges.size(), 1u);
  ASSERT_EQ(txn.ranges[0].size(), 1u);
  EXPECT_EQ(txn.ranges[0][0].value, "agent-0");
}

TEST(EtcdWire, LeaseAndStatusAnswersOfEtcd34) {
  const auto lease =
      decode_grant(ok("{" + kHeader + R"(,"ID":"6776688527439907085","TTL":"30"})"), "test");
  EXPECT_EQ(lease.id, 6776688527439907085);
  EXPECT_EQ(lease.ttl_s, 30);
  // The keepalive of a lease etcd no longer knows: a result without TTL.
  EXPECT_EQ(decode_keepalive(ok(R"({"result":{)" + kHeader + R"(,"ID":"12345"}})"), "test"), 0);
  const auto status = decode_status(
      ok("{" + kHeader + R"(,"version":"3.4.23","leader":"14504840459477854813"})"), "h:1", "t");
  EXPECT_EQ(status.member_id, 14504840459477854813u);  // above 2^63
  EXPECT_EQ(status.leader_id, 14504840459477854813u);
  EXPECT_EQ(status.raft_term, 2);
}

TEST(EtcdWire, RefusalsOfBothShapes) {
  const std::string lost =
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested )"
      R"(lease not found","code":5})";
  const auto r = decode_error(404, parse_answer(lost, 404, "t"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->grpc_code, 5);
  EXPECT_FALSE(worth_another_member(*r));
  EXPECT_THROW(throw_refusal(*r, "etcd put 'k'", "h:1"), PeerLost);
  const auto stream = decode_error(
      200, ok(R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}})"));
  ASSERT_TRUE(stream.has_value());
  EXPECT_EQ(stream->http_status, 503);
  EXPECT_TRUE(worth_another_member(*stream));
  EXPECT_FALSE(decode_error(200, ok("{" + kHeader + "}")).has_value());
}

// What fuzz_etcd_answer found in the decoding as first written.
TEST(EtcdWire, FuzzFindingsAreRefusedOrEscaped) {
  // etcd's message with a terminal escape: kept, but escaped.
  const auto r = decode_error(400, parse_answer(R"({"message":"a\u001b[2Jb","code":3})", 400, "t"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->message, "a\\x1b[2Jb");
  // 200,000 levels of arrays: refused before nlohmann builds (and recursively prints) them.
  const std::string deep =
      R"({"header":{"revision":)" + std::string(200000, '[') + std::string(200000, ']') + "}}";
  EXPECT_THROW(parse_answer(deep, 200, "t"), CorruptData);
  EXPECT_NO_THROW(parse_answer(R"({"s":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})", 200, "t"));
  // An int64 above 2^63-1 would wrap to a negative revision.
  EXPECT_THROW(decode_delete(ok(R"({"deleted":9223372036854775808})"), "t"), CorruptData);
  EXPECT_EQ(decode_delete(ok(R"({"deleted":9223372036854775807})"), "t"), 9223372036854775807);
  // Fields of the wrong type.
  EXPECT_THROW(decode_put(ok(R"({"header":"x"})"), "t"), CorruptData);
  EXPECT_THROW(decode_txn(ok(R"({"responses":[7]})"), 1, 1, "t"), CorruptData);
  EXPECT_THROW(parse_answer("[1]", 200, "t"), CorruptData);
}

}  // namespace
}  // namespace krab::elastic::etcd_wire
