// PeerMonitor: heartbeats and progress of every rank in a group, for error messages that name
// ranks.
//
// Gloo's own errors say "connection closed by peer 127.0.0.1:41234" or "timed out waiting
// for recv" and name no rank. To say which rank died or which ranks never joined a collective,
// every rank runs a PeerMonitor: a background thread that, every `period`, writes to the store
// (under the group's prefix) a record "<beat> <last collective seq entered> <op name>". The
// training thread only bumps an atomic (enter()); nothing on the hot path touches the network.
//
// When an operation fails, diagnose() reads every rank's record every `period` for between 3
// and 15 periods (it stops once every rank's beat has moved):
//   - a rank whose beat did not move in 15 periods (3 s by default) is gone (its process died
//     or froze);
//   - a live rank whose last entered sequence number is below the failed one never joined.
//
// Thread safety: enter() and diagnose() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"

namespace krab::comm {

class PeerMonitor {
 public:
  struct PeerState {
    int rank = -1;
    bool alive = true;
    bool reported = false;  // false: the rank never wrote a record
    int64_t seq = -1;       // last collective it entered
    std::string op;
  };

  // `connect` opens a new store client (the monitor's own connection, so its writes never
  // queue behind the training thread's store traffic).
  PeerMonitor(std::function<StorePtr()> connect, int rank, int size,
              std::chrono::milliseconds period = std::chrono::milliseconds(200));
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // One rank's heartbeat record as the store holds it ("<beat> <seq> <op>" under "hb/<rank>").
  struct Record {
    bool present = false;  // false: the rank has not written one (yet)
    int64_t beat = -1;
    int64_t seq = -1;
    std::string op;
  };

  // Reads ranks 0..size-1's records from `store`, which must carry the group's prefix (as the
  // monitor's own connection does: "g<generation>/" under the job's secret). Non-blocking: a
  // missing or unreadable record is left !present. Never throws. The elastic keeper polls
  // these (docs/design/elastic.md §3.3).
  static std::vector<Record> read_records(c10d::Store& store, int size);

  // Records that this rank entered collective `seq` (op name must be a string literal).
  void enter(int64_t seq, const char* op);

  // Snapshot of every rank; takes 3 periods, or up to 15 when a rank looks dead. Never throws.
  std::vector<PeerState> diagnose();

 private:
  void run();
  std::string record() const;

  std::function<StorePtr()> connect_;
  int rank_;
  int size_;
  std::chrono::milliseconds period_;
  std::atomic<int64_t> seq_{-1};
  std::atomic<const char*> op_{"none"};
  std::atomic<int64_t> beat_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  StorePtr store_;  // owned by the thread after start
  std::thread thread_;
};

// "rank 2", "ranks 1, 3".
std::string describe_ranks(const std::vector<int>& ranks);

}  // namespace krab::comm
