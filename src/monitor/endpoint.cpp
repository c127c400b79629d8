#include "monitor/endpoint.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/errors.h"

namespace krab::monitor {
namespace {

// Two threads answer: Prometheus and a browser at once. httplib's default pool has a thread
// per core, idle for the whole run.
constexpr size_t kServerThreads = 2;

// httplib only says that binding failed. Binding a plain socket the same way again tells why,
// in the words of the key the user has to change.
std::string why_bind_failed(const std::string& bind, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(bind.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 ||
      found == nullptr)
    return str_cat("monitor.bind ", bind, ": not an address or host name this machine resolves");
  int err = 0;
  const int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (fd < 0) {
    err = errno;
  } else {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0) err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  switch (err) {
    case EADDRINUSE:
      return str_cat("monitor.port ", port, ": the port is in use on ", bind);
    case EADDRNOTAVAIL:
      return str_cat("monitor.bind ", bind, ": not an address of this machine");
    case EACCES:
      return str_cat("monitor.port ", port, ": a port below 1024 needs privileges");
    case 0:  // free again: another process held it for a moment
      return str_cat("monitor.port ", port, ": cannot listen on ", bind, " (busy; try again)");
    default:
      return str_cat("monitor.bind ", bind, ", monitor.port ", port,
                     ": cannot listen: ", std::strerror(err));
  }
}

}  // namespace

struct Endpoint::Impl {
  httplib::Server server;
  std::string bind;
  int port = 0;
  std::thread thread;
  std::atomic<bool> finished{false};

  struct Route {
    std::string content_type;
    std::function<std::string()> body;
  };
  std::mutex mutex;
  std::map<std::string, Route> routes;

  void answer(const httplib::Request& req, httplib::Response& res);
};

void Endpoint::Impl::answer(const httplib::Request& req, httplib::Response& res) {
  Route route;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = routes.find(req.path);
    if (it == routes.end()) {
      res.status = 404;
      res.set_content("not found\n", "text/plain");
      return;
    }
    route = it->second;
  }
  try {
    res.set_content(route.body(), route.content_type.c_str());
  } catch (const std::exception& e) {
    res.status = 500;
    res.set_content(str_cat(e.what(), "\n"), "text/plain");
  }
}

Endpoint::Endpoint(const std::string& bind, int port) : impl_(std::make_unique<Impl>()) {
  KRAB_CHECK_ARG(port >= 0 && port <= 65535, "monitor.port ", port, ": not a TCP port");
  Impl& m = *impl_;
  m.bind = bind;
  // SO_REUSEADDR alone: a port left in TIME_WAIT by the last run is taken again, a port some
  // process listens on is refused (httplib's default, SO_REUSEPORT, would share it).
  m.server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  m.server.new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  m.server.Get(".*",
               [&m](const httplib::Request& req, httplib::Response& res) { m.answer(req, res); });
  if (port == 0) {
    m.port = m.server.bind_to_any_port(bind);
    if (m.port < 0) throw InvalidArgument(why_bind_failed(bind, 0));
  } else {
    if (!m.server.bind_to_port(bind, port)) throw InvalidArgument(why_bind_failed(bind, port));
    m.port = port;
  }
  m.thread = std::thread([&m] {
    try {
      m.server.listen_after_bind();
    } catch (...) {  // nothing to hand it to: the endpoint just stops answering
    }
    m.finished = true;
  });
}

Endpoint::~Endpoint() {
  Impl& m = *impl_;
  // httplib's stop() does nothing before its loop has started (is_running() false), and the
  // loop would then run forever: wait for it to start, or to have given up.
  while (!m.server.is_running() && !m.finished)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  m.server.stop();
  m.thread.join();
}

void Endpoint::route(const std::string& path, const std::string& content_type,
                     std::function<std::string()> body) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->routes[path] = {content_type, std::move(body)};
}

int Endpoint::port() const { return impl_->port; }

const std::string& Endpoint::bind() const { return impl_->bind; }

}  // namespace krab::monitor
