#include "monitor/trace_sink.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace krab::monitor {

namespace {

using std::chrono::nanoseconds;

// The system clock minus the steady clock, read once: every event of the process shifts by
// the same amount, so its spans keep their steady-clock lengths and order.
int64_t steady_to_unix_nanos() {
  static const int64_t offset = [] {
    const auto sys = std::chrono::system_clock::now().time_since_epoch();
    const auto steady = std::chrono::steady_clock::now().time_since_epoch();
    return std::chrono::duration_cast<nanoseconds>(sys).count() -
           std::chrono::duration_cast<nanoseconds>(steady).count();
  }();
  return offset;
}

int64_t unix_nanos(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<nanoseconds>(t.time_since_epoch()).count() +
         steady_to_unix_nanos();
}

// ts in microseconds with three decimals, from integer nanoseconds: a double would keep only
// about a quarter of a microsecond at today's 1.7e15 µs since the epoch.
struct Micros {
  char text[32];
  explicit Micros(int64_t ns) {
    if (ns < 0) ns = 0;
    std::snprintf(text, sizeof(text), "%lld.%03lld", static_cast<long long>(ns / 1000),
                  static_cast<long long>(ns % 1000));
  }
};

constexpr size_t kBuffer = 1 << 16;

}  // namespace

int track_of(const std::string& span_name) {
  if (span_name.rfind("comm.", 0) == 0) return kCommTrack;
  if (span_name == "membership") return kMembershipTrack;
  if (span_name.rfind("op.", 0) == 0) return kOpTrack;
  return kPhaseTrack;
}

double unix_micros(std::chrono::steady_clock::time_point t) {
  return static_cast<double>(unix_nanos(t)) / 1e3;
}

std::string json_quote(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

TraceSink::TraceSink(const std::string& path, TraceProcess process)
    : path_(path), pid_(process.pid) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw Error(str_cat("cannot write the trace part '", path, "': ", std::strerror(errno)));
  std::setvbuf(file_, nullptr, _IOFBF, kBuffer);
  steady_to_unix_nanos();  // the offset is measured now, not in the middle of a step
  write_metadata("process_name", 0, process.name);
  write_metadata("thread_name", kPhaseTrack, "step phases");
  write_metadata("thread_name", kCommTrack, "communication (buckets)");
  write_metadata("thread_name", kMembershipTrack, "membership, notes");
  // Rows in rank order, whatever order the parts are merged in.
  std::fprintf(file_,
               "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\","
               "\"args\":{\"sort_index\":%d}}\n",
               pid_, pid_);
  for (int tid = kPhaseTrack; tid <= kMembershipTrack; ++tid)
    std::fprintf(file_,
                 "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\","
                 "\"args\":{\"sort_index\":%d}}\n",
                 pid_, tid, tid);
  std::fflush(file_);
}

TraceSink::~TraceSink() {
  if (file_ != nullptr) std::fclose(file_);
}

void TraceSink::write_metadata(const std::string& what, int tid, const std::string& value) {
  std::fprintf(file_,
               "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"name\":%s}}\n",
               pid_, tid, what.c_str(), json_quote(value).c_str());
}

const std::string& TraceSink::quoted(const std::string& name) {
  auto it = quoted_.find(name);
  if (it == quoted_.end()) it = quoted_.emplace(name, json_quote(name)).first;
  return it->second;
}

void TraceSink::on_span(const std::string& name, std::chrono::steady_clock::time_point start,
                        double seconds) {
  // A span measured across a clock oddity could come out negative or NaN; the format wants a
  // number >= 0.
  const double micros = std::isfinite(seconds) && seconds > 0 ? seconds * 1e6 : 0.0;
  const int tid = track_of(name);
  if (tid == kOpTrack && !op_track_named_) {
    write_metadata("thread_name", kOpTrack, "operators (LibTorch profiler)");
    op_track_named_ = true;
  }
  const Micros ts(unix_nanos(start));
  std::fprintf(file_, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%.3f,\"name\":%s}\n",
               pid_, tid, ts.text, micros, quoted(name).c_str());
  // The step's events reach the file together. (on_step would not do: only a rank that
  // draws the progress bar receives it.)
  if (name == "step") std::fflush(file_);
}

void TraceSink::on_gauge(const std::string& name, double value, int64_t step) {
  if (!std::isfinite(value)) return;
  const Micros ts(unix_nanos(std::chrono::steady_clock::now()));
  std::fprintf(file_,
               "{\"ph\":\"C\",\"pid\":%d,\"ts\":%s,\"name\":%s,\"args\":{\"value\":%.17g}}\n", pid_,
               ts.text, quoted(name).c_str(), value);
}

void TraceSink::on_note(const std::string& text) {
  const Micros ts(unix_nanos(std::chrono::steady_clock::now()));
  std::fprintf(file_, "{\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"name\":%s}\n",
               pid_, kMembershipTrack, ts.text, json_quote(text).c_str());
  std::fflush(file_);
}

}  // namespace krab::monitor
