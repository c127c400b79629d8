// monitor/endpoint.h on loopback: a GET through httplib's client, and the two refusals named
// by their keys. 192.0.2.1 is TEST-NET-1 (RFC 5737), never an address of a machine; binding
// to it fails locally and sends nothing.
#include "monitor/endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <stdexcept>

#include "core/errors.h"
#include "monitor/exposition.h"

namespace krab::monitor {
namespace {

std::string message_of(const std::string& bind, int port) {
  try {
    Endpoint e(bind, port);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(Endpoint, ServesItsRoutes) {
  Endpoint endpoint("127.0.0.1", 0);
  ASSERT_GT(endpoint.port(), 0);
  int calls = 0;
  endpoint.route("/metrics", kExpositionType, [&calls] {
    ++calls;
    return std::string("krab_up 1\n");
  });
  endpoint.route("/boom", "text/plain", []() -> std::string { throw std::runtime_error("no"); });
  httplib::Client client("127.0.0.1", endpoint.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "krab_up 1\n");
  EXPECT_EQ(res->get_header_value("Content-Type"), kExpositionType);
  EXPECT_EQ(calls, 1);
  res = client.Get("/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  res = client.Get("/boom");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(res->body, "no\n");
}

TEST(Endpoint, APortInUseIsRefusedNamingMonitorPort) {
  Endpoint first("127.0.0.1", 0);
  const int port = first.port();
  EXPECT_EQ(message_of("127.0.0.1", port),
            "monitor.port " + std::to_string(port) + ": the port is in use on 127.0.0.1");
}

TEST(Endpoint, AnAddressNotOfThisMachineIsRefusedNamingMonitorBind) {
  EXPECT_EQ(message_of("192.0.2.1", 0), "monitor.bind 192.0.2.1: not an address of this machine");
  EXPECT_EQ(message_of("192.0.2.1", 9), "monitor.bind 192.0.2.1: not an address of this machine");
}

TEST(Endpoint, StopsRightAfterStarting) {
  for (int i = 0; i < 20; ++i) Endpoint("127.0.0.1", 0);  // no route, no request: joins
}

}  // namespace
}  // namespace krab::monitor
