#include "cli/trace_output.h"

#include <cstdio>

#include "cli/launcher.h"
#include "core/errors.h"
#include "core/printable.h"
#include "monitor/trace_merge.h"

namespace krab::cli {

std::unique_ptr<TraceOutput> TraceOutput::start(const std::string& file, LaunchPlan& plan) {
  if (file.empty()) return nullptr;
  std::unique_ptr<TraceOutput> out(new TraceOutput(file));
  plan.trace_dir = out->dir_.path;
  return out;
}

void TraceOutput::write() const {
  const std::string shown = core::printable_text(file_);
  try {
    const monitor::MergeStats stats =
        monitor::merge_trace_parts(monitor::list_trace_parts(dir_.path), file_);
    if (stats.skipped > 0)
      std::fprintf(stderr, "krab: --trace left out %lld torn line(s) of a worker cut short\n",
                   static_cast<long long>(stats.skipped));
    std::fprintf(stderr, "krab: trace %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                 shown.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "krab: warning: --trace %s was not written: %s\n", shown.c_str(),
                 e.what());
  }
}

}  // namespace krab::cli
