#include "monitor/snapshot_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace krab::monitor {
namespace {

// The span names that are step phases (train/step_phases.h): monitor sits below train, so it
// matches the names rather than linking the loop. comm.bucket.<b> is left out: one series per
// bucket would grow with the model, and the bottleneck needs none of them.
bool is_phase(const std::string& name) {
  return name == "step" || name.rfind("step.", 0) == 0 || name == "evaluation" ||
         name == "checkpoint" || name == "membership";
}

double unix_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// Replaces `path` with `text`: a temporary beside it, then rename(), so that the launcher reads
// either the old file or the new one. No fsync, unlike core::write_file_atomic: a snapshot is
// a live view that the run's end removes, and a flush to disk every half second would cost
// the training loop more than the numbers are worth after a crash.
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(str_cat("cannot write ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(str_cat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(str_cat("cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
  }
}

template <typename T>
T field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) throw CorruptData(str_cat("monitor snapshot: no field '", key, "'"));
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw CorruptData(str_cat("monitor snapshot: field '", key, "' has the wrong type"));
  }
}

}  // namespace

nlohmann::json to_json(const Snapshot& s) {
  nlohmann::json step_seconds{{"le", kStepBuckets},
                              {"counts", s.step_counts},
                              {"sum", s.step_sum},
                              {"count", s.step_count}};
  return {{"rank", s.rank},           {"member", s.member},
          {"node", s.node},           {"pid", s.pid},
          {"unix_time", s.unix_time}, {"steps", s.steps},
          {"counters", s.counters},   {"gauges", s.gauges},
          {"phases", s.phases},       {"step_seconds", std::move(step_seconds)},
          {"rss_bytes", s.rss_bytes}};
}

Snapshot snapshot_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw CorruptData("monitor snapshot: not a JSON object");
  Snapshot s;
  s.rank = field<int>(j, "rank");
  s.member = field<std::string>(j, "member");
  s.node = field<std::string>(j, "node");
  s.pid = field<int64_t>(j, "pid");
  s.unix_time = field<double>(j, "unix_time");
  s.steps = field<int64_t>(j, "steps");
  s.counters = field<std::map<std::string, double>>(j, "counters");
  s.gauges = field<std::map<std::string, double>>(j, "gauges");
  s.phases = field<std::map<std::string, double>>(j, "phases");
  const auto hist = field<nlohmann::json>(j, "step_seconds");
  const auto le = field<std::vector<double>>(hist, "le");
  const auto counts = field<std::vector<int64_t>>(hist, "counts");
  // A writer with other bounds (another krab version) cannot be merged into these buckets.
  if (le != std::vector<double>(kStepBuckets.begin(), kStepBuckets.end()) ||
      counts.size() != kStepBuckets.size())
    throw CorruptData("monitor snapshot: step_seconds has other buckets");
  std::copy(counts.begin(), counts.end(), s.step_counts.begin());
  s.step_sum = field<double>(hist, "sum");
  s.step_count = field<int64_t>(hist, "count");
  s.rss_bytes = field<int64_t>(j, "rss_bytes");
  return s;
}

std::vector<Snapshot> read_snapshots(const std::string& dir) {
  std::vector<Snapshot> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.rfind("rank-", 0) == 0 || name.rfind("member-", 0) == 0;
    if (!ours || name.size() < 5 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    try {
      out.push_back(snapshot_from_json(nlohmann::json::parse(text.str())));
    } catch (const std::exception&) {
      continue;  // see the header: skipped, the next scrape will see it
    }
  }
  return latest_per_rank(std::move(out));
}

std::vector<Snapshot> latest_per_rank(std::vector<Snapshot> all) {
  // Newest first, so that the first of each rank is the one kept.
  std::sort(all.begin(), all.end(), [](const Snapshot& a, const Snapshot& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.unix_time > b.unix_time;
  });
  const Snapshot* newest_view = nullptr;  // the newest that knows the group's size
  for (const Snapshot& s : all)
    if (s.gauges.count("workers") &&
        (newest_view == nullptr || s.unix_time > newest_view->unix_time))
      newest_view = &s;
  const double workers = newest_view ? newest_view->gauges.at("workers") : -1;
  std::vector<Snapshot> out;
  for (Snapshot& s : all) {
    if (!out.empty() && out.back().rank == s.rank) continue;
    if (workers >= 0 && s.rank >= workers) continue;
    out.push_back(std::move(s));
  }
  return out;
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

SnapshotSink::SnapshotSink(std::string dir, Identity who)
    : path_(who.member.empty() ? str_cat(dir, "/rank-", who.rank, ".json")
                               : str_cat(dir, "/member-", who.member, ".json")) {
  snap_.rank = who.rank;
  snap_.member = std::move(who.member);
  snap_.node = host_name();
  snap_.pid = static_cast<int64_t>(::getpid());
}

SnapshotSink::~SnapshotSink() {
  try {
    flush();
  } catch (...) {
  }
}

void SnapshotSink::on_counter(const std::string& name, double delta) {
  snap_.counters[name] += delta;
}

void SnapshotSink::on_gauge(const std::string& name, double value, int64_t) {
  snap_.gauges[name] = value;
}

void SnapshotSink::on_span(const std::string& name, std::chrono::steady_clock::time_point,
                           double seconds) {
  if (!is_phase(name)) return;
  snap_.phases[name] += seconds;
  if (name == "step") {
    ++snap_.steps;
    for (size_t i = 0; i < kStepBuckets.size(); ++i)
      if (seconds <= kStepBuckets[i]) ++snap_.step_counts[i];
    snap_.step_sum += seconds;
    ++snap_.step_count;
  }
  maybe_write();
}

void SnapshotSink::on_step(int64_t, int64_t) { maybe_write(); }

void SnapshotSink::flush() {
  snap_.unix_time = unix_now();
  snap_.rss_bytes = resident_bytes();
  replace_file(path_, to_json(snap_).dump());
  last_write_ = std::chrono::steady_clock::now();
  written_ = true;
}

void SnapshotSink::maybe_write() {
  const auto now = std::chrono::steady_clock::now();
  if (written_ && now - last_write_ < kSnapshotPeriod) return;
  // A full disk or a removed directory must not stop training: the endpoint shows the last
  // snapshot written, and the loop's final flush() says why the numbers stopped.
  try {
    flush();
  } catch (const Error&) {
    last_write_ = now;
    written_ = true;
  }
}

}  // namespace krab::monitor
