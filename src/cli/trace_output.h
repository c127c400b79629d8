// --trace FILE on the launcher's side (docs/monitoring.md, "Timeline"): a private directory
// where this node's workers stream their parts (monitor/trace_sink.h; the plan names it, and
// the launcher passes KRAB_TRACE_PART to each worker), merged into FILE once the workers are
// done, whatever the run's outcome (a failed run's timeline shows where it stopped).
#pragma once

#include <memory>
#include <string>

#include "cli/private_dir.h"

namespace krab::cli {

struct LaunchPlan;

class TraceOutput {
 public:
  // Null when `file` is empty (no --trace); else sets plan.trace_dir.
  static std::unique_ptr<TraceOutput> start(const std::string& file, LaunchPlan& plan);
  // Merges the parts into the file and says where it is. The run's exit code stands: a
  // timeline that cannot be written is a warning.
  void write() const;

 private:
  explicit TraceOutput(std::string file) : file_(std::move(file)) {}
  std::string file_;
  PrivateDir dir_{"trace", "the workers' parts of --trace"};
};

}  // namespace krab::cli
