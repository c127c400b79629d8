// Events: the one small interface through which layers report what happens while training,
// and the sinks that turn it into what a user sees.
//
// A layer holds an Events (a fan-out to sinks) and calls:
//   * counter(name, delta)      — something that only grows (bytes sent, examples seen);
//   * gauge(name, value, step)  — a value that holds at a training step (loss, samples/s,
//                                 test accuracy, the train seconds an evaluation is taken at);
//   * span(name, start, seconds) — a piece of work: when it started (steady clock, shared by
//                                 the processes of a machine) and how long it took
//                                 (Events::time() measures one; span(name, seconds) ends now);
//   * step(done, total)         — a training step ended; the gauges set at it are current;
//   * note(text)                — a line for the user (resumed from, a worker counted out).
// Sinks receive every call and keep or draw what they need: the progress bar, the JSON report,
// stderr, the monitoring endpoint's snapshots, the trace timeline, the bottleneck breakdown.
// The layers that emit do not change when a sink is added.
//
// Names are dotted lower-case words ("loss", "test_accuracy", "bytes_sent.allreduce"). The
// spans a training step is made of are listed in train/step_phases.h.
// Thread safety: one thread emits (the training thread); sinks need no locks of their own.
// No torch: every layer may use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace krab::core {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_counter(const std::string& name, double delta) {}
  virtual void on_gauge(const std::string& name, double value, int64_t step) {}
  virtual void on_span(const std::string& name, std::chrono::steady_clock::time_point start,
                       double seconds) {}
  virtual void on_step(int64_t done, int64_t total) {}
  virtual void on_note(const std::string& text) {}
};

class Events {
 public:
  void add(std::shared_ptr<EventSink> sink);

  void counter(const std::string& name, double delta = 1) const;
  void gauge(const std::string& name, double value, int64_t step) const;
  // A span that ends now.
  void span(const std::string& name, double seconds) const;
  void span(const std::string& name, std::chrono::steady_clock::time_point start,
            double seconds) const;
  // Whether any sink was added (callers may skip building what nobody receives).
  bool empty() const { return sinks_.empty(); }
  void step(int64_t done, int64_t total) const;
  void note(const std::string& text) const;

  // Measures from construction to destruction (or stop()) and reports it as a span.
  class Timer {
   public:
    Timer(const Events& events, std::string name);
    ~Timer() { stop(); }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    // Reports now (once) and returns the seconds measured.
    double stop();

   private:
    const Events* events_;
    std::string name_;
    std::chrono::steady_clock::time_point start_;
    bool stopped_ = false;
  };
  Timer time(std::string name) const { return Timer(*this, std::move(name)); }

 private:
  std::vector<std::shared_ptr<EventSink>> sinks_;
};

// Notes as lines on a stream: "krab: <text>\n".
class NoteSink : public EventSink {
 public:
  explicit NoteSink(std::FILE* out = stderr) : out_(out) {}
  void on_note(const std::string& text) override;

 private:
  std::FILE* out_;
};

}  // namespace krab::core
