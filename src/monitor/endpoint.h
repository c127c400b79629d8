// The node's monitoring endpoint: a small HTTP server (cpp-httplib, which Debian ships) that
// the launcher runs while its workers train, serving /metrics to Prometheus and, later, the
// dashboard's page (docs/monitoring.md).
//
//   monitor::Endpoint endpoint(config.get_string("monitor.bind"), port);   // throws if taken
//   endpoint.route("/metrics", monitor::kExpositionType, [&] {
//     return monitor::render_metrics(monitor::read_snapshots(dir), node);
//   });
//   ... spawn the workers, wait for them ...
//   // the destructor stops the server
//
// The constructor binds synchronously, so that a port in use or an address this machine does
// not have is an error before any worker starts, and the server thread answers from then on.
// Routes may be added at any time; a path with no route answers 404. Only GET is served.
// The server binds without SO_REUSEPORT: a second krab on the same port is refused rather
// than sharing the port's connections with the first.
//
// Nothing here decides what is shown: callers route only what is safe to show (no secret, no
// path). The address is `monitor.bind`'s: 127.0.0.1 unless the user asks for more.
// Thread safety: route() may be called from any thread while requests are served; a route's
// body callback runs on one of the server's threads (two at most) and must be thread-safe.
// httplib.h stays in endpoint.cpp: its classes change with its compile flags, and every
// includer would pay for parsing it.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace krab::monitor {

class Endpoint {
 public:
  // Binds `bind`:`port` (port 0: any free port, for tests) and starts serving. Throws
  // krab::InvalidArgument naming the key at fault:
  //   "monitor.port 9100: the port is in use on 127.0.0.1"
  //   "monitor.bind 192.0.2.1: not an address of this machine"
  Endpoint(const std::string& bind, int port);
  // Stops the server and joins its thread (at most about a second: httplib polls).
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Serves GET `path` (exact match) with `body()`'s text. An exception from `body` answers
  // 500 with its message. A second route for a path replaces the first.
  void route(const std::string& path, const std::string& content_type,
             std::function<std::string()> body);

  // The port bound (the one chosen when 0 was asked for).
  int port() const;
  const std::string& bind() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace krab::monitor
