#include "monitor/trace_merge.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fs.h"

namespace krab::monitor {

namespace {

// Batches the events into large writes: AtomicFileWriter writes what it is given at once.
class BufferedOut {
 public:
  explicit BufferedOut(core::AtomicFileWriter& file) : file_(file) {}
  void add(const std::string& text) {
    buffer_ += text;
    if (buffer_.size() >= kFlushAt) flush();
  }
  void flush() {
    file_.write(buffer_);
    buffer_.clear();
  }

 private:
  static constexpr size_t kFlushAt = 1 << 20;
  core::AtomicFileWriter& file_;
  std::string buffer_;
};

// A line the viewers can take as an event: a whole JSON object. A torn line (the writer
// killed mid-write) fails to parse; accept() checks without building the value.
bool whole_event(const std::string& line) {
  const size_t first = line.find_first_not_of(" \t\r");
  return first != std::string::npos && line[first] == '{' && nlohmann::json::accept(line);
}

}  // namespace

MergeStats merge_trace_parts(const std::vector<std::string>& parts, const std::string& out) {
  MergeStats stats;
  core::AtomicFileWriter file(out, core::FileAccess::kShared);
  BufferedOut writer(file);
  writer.add("{\"traceEvents\":[\n");
  std::string line;
  for (const std::string& part : parts) {
    std::ifstream in(part, std::ios::binary);
    if (!in) continue;
    ++stats.parts;
    while (std::getline(in, line)) {
      if (!whole_event(line)) {
        ++stats.skipped;
        continue;
      }
      writer.add(stats.events == 0 ? line : ",\n" + line);
      ++stats.events;
    }
  }
  writer.add("\n],\"displayTimeUnit\":\"ms\"}\n");
  writer.flush();
  file.commit();
  return stats;
}

std::vector<std::string> list_trace_parts(const std::string& dir) {
  std::vector<std::string> parts;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".jsonl") parts.push_back(entry.path().string());
  std::sort(parts.begin(), parts.end());
  return parts;
}

}  // namespace krab::monitor
