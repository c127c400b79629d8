// A private etcd for a C++ test: runs tests/elastic/support/start_etcd.sh (free 127.0.0.1
// ports, a temp data dir, every member healthy before it returns) and stops it on destruction.
//
//   std::string skip;
//   auto etcd = EtcdDaemon::start(3, &skip);
//   if (!etcd) GTEST_SKIP() << skip;          // no etcd binary (the script exits 77)
//   etcd->endpoints();                        // "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
//   etcd->kill_member(0);                     // SIGKILL, returns once it is gone
//
// The script gets SIGTERM if the test process dies (PR_SET_PDEATHSIG), and its own watchdog
// and EXIT trap stop the members and remove the data, so a crashed test leaves nothing behind.
// start() throws std::runtime_error when etcd fails to start (bounded: 60 s).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace krab::test {

class EtcdDaemon {
 public:
  static std::unique_ptr<EtcdDaemon> start(int members, std::string* skip_reason);
  ~EtcdDaemon();  // SIGTERM to the script, which stops the members (bounded; then SIGKILL)
  EtcdDaemon(const EtcdDaemon&) = delete;
  EtcdDaemon& operator=(const EtcdDaemon&) = delete;

  const std::string& endpoints() const { return endpoints_; }  // --rdzv-endpoints form
  const std::vector<std::string>& endpoint_list() const { return list_; }
  // SIGKILLs member `i` and waits (bounded, 5 s) until it no longer runs.
  void kill_member(size_t i);

 private:
  EtcdDaemon() = default;
  pid_t script_ = -1;
  std::string endpoints_;
  std::vector<std::string> list_;
  std::vector<pid_t> members_;
};

// A 127.0.0.1 port nothing listens on (bound by the kernel, then released): connecting to it
// is refused at once.
int closed_port();

}  // namespace krab::test
