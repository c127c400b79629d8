#include "comm/store.h"

#include <arpa/inet.h>
#include <c10/util/hash.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "core/errors.h"

namespace krab::comm {

std::string Endpoint::to_string() const {
  return file.empty() ? str_cat(host, ":", port) : str_cat("file ", file);
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

Endpoint parse_endpoint(const std::string& text, const std::string& what) {
  auto colon = text.rfind(':');
  KRAB_CHECK_ARG(colon != std::string::npos && colon > 0 && colon + 1 < text.size(), what,
                 " must be HOST:PORT, got '", text, "'");
  Endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']')
    e.host = e.host.substr(1, e.host.size() - 2);
  const std::string port = text.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  KRAB_CHECK_ARG(end && *end == '\0' && p >= 1 && p <= 65535, what, ": port '", port,
                 "' is not a number in 1..65535");
  e.port = static_cast<int>(p);
  return e;
}

namespace {

// True when something already listens on host:port. TCPStore's own bind error is a long
// c10 message; users need one line that names the port.
bool port_in_use(const std::string& host, int port) {
  if (port == 0) return false;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  bool in_use =
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

// The job's keys live under a name only holders of the secret can compute (store.h). SHA-1 is
// enough here: the secret is 32 random bytes, and only its preimage resistance matters.
StorePtr under_secret(const std::string& secret, StorePtr base) {
  if (secret.empty()) return base;
  c10::sha1 digest("krab rendezvous prefix\n" + secret);
  return prefixed(str_cat("krab-", digest.str(), "/"), std::move(base));
}

}  // namespace

StoreServer::StoreServer(const Endpoint& at) {
  // FileStore opens the file with mode 0644; made first, it keeps 0600.
  // O_NOFOLLOW: a symlink planted at the name would make FileStore append to its target.
  const int fd = ::open(at.file.c_str(), O_CREAT | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
  KRAB_CHECK_ARG(fd >= 0, "cannot create the rendezvous file ", at.file, ": ",
                 std::strerror(errno));
  ::close(fd);
  store_ = under_secret(at.secret, c10::make_intrusive<c10d::FileStore>(at.file, -1));
}

StoreServer::StoreServer(const std::string& host, int port, std::chrono::milliseconds timeout,
                         const std::string& secret) {
  KRAB_CHECK_ARG(!port_in_use(host, port), "rendezvous port ", port,
                 " is already in use (pick another with --rdzv HOST:PORT)");
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    tcp_ = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    throw InvalidArgument(str_cat("cannot host the rendezvous store on ", host, ":", port, ": ",
                                  std::string(e.what()).substr(0, 200)));
  }
  store_ = under_secret(secret, tcp_);
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const { return tcp_ ? tcp_->getPort() : 0; }

StorePtr StoreServer::store() const { return store_; }

StorePtr connect_store(const Endpoint& at, std::chrono::milliseconds timeout) {
  if (!at.file.empty()) {
    KRAB_CHECK_ARG(::access(at.file.c_str(), R_OK | W_OK) == 0, "the rendezvous file ", at.file,
                   " is not there (KRAB_STORE_FILE; is the launcher gone?)");
    auto store = c10::make_intrusive<c10d::FileStore>(at.file, -1);
    store->setTimeout(timeout);
    return under_secret(at.secret, store);
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(at.port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  // TCPStore's client retries its connect until the timeout; its exception text is long and
  // names no option, so it is replaced by one line.
  try {
    return under_secret(at.secret, c10::make_intrusive<c10d::TCPStore>(at.host, opts));
  } catch (const std::exception& e) {
    throw Timeout(str_cat("cannot reach the rendezvous store at ", at.to_string(), " within ",
                          timeout.count() / 1000.0, " s"));
  }
}

namespace {

class ReconnectingStore : public c10d::Store {
 public:
  ReconnectingStore(Endpoint at, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), at_(std::move(at)), client_(connect_store(at_, timeout)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    call([&](c10d::Store& s) { s.set(key, value); });
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return call([&](c10d::Store& s) { return s.compareSet(key, expected, desired); });
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return call([&](c10d::Store& s) { return s.get(key); });
  }
  int64_t add(const std::string& key, int64_t value) override {
    return call([&](c10d::Store& s) { return s.add(key, value); });
  }
  bool deleteKey(const std::string& key) override {
    return call([&](c10d::Store& s) { return s.deleteKey(key); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return call([&](c10d::Store& s) { return s.check(keys); });
  }
  int64_t getNumKeys() override {
    return call([&](c10d::Store& s) { return s.getNumKeys(); });
  }
  void wait(const std::vector<std::string>& keys) override {
    call([&](c10d::Store& s) { s.wait(keys); });
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    call([&](c10d::Store& s) { s.wait(keys, timeout); });
  }

 private:
  // A call on the live client; after a failure the client is dropped (store.h says why) and the
  // next call connects a new one, within the timeout, before it runs.
  template <typename Fn>
  auto call(Fn&& fn) -> decltype(fn(std::declval<c10d::Store&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!client_) client_ = connect_store(at_, timeout_);
    try {
      return fn(*client_);
    } catch (...) {
      client_.reset();
      throw;
    }
  }

  const Endpoint at_;
  std::mutex mu_;
  StorePtr client_;  // guarded by mu_; null after a failed call
};

}  // namespace

StorePtr reconnecting_store(const Endpoint& at, std::chrono::milliseconds timeout) {
  if (!at.file.empty()) return connect_store(at, timeout);
  return c10::make_intrusive<ReconnectingStore>(at, timeout);
}

StorePtr prefixed(const std::string& prefix, StorePtr base) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(base));
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr)
    throw InvalidArgument(str_cat("cannot resolve rendezvous host '", host, "'"));
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out = "127.0.0.1";
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

}  // namespace krab::comm
