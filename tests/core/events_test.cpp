// core/events.h: every call reaches every sink, in order; timers report once.
#include "core/events.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace krab::core {
namespace {

class Recorder : public EventSink {
 public:
  void on_counter(const std::string& name, double delta) override {
    lines.push_back("counter " + name + " " + std::to_string(delta));
  }
  void on_gauge(const std::string& name, double value, int64_t step) override {
    lines.push_back("gauge " + name + " " + std::to_string(value) + " @" + std::to_string(step));
  }
  void on_span(const std::string& name, std::chrono::steady_clock::time_point start,
               double seconds) override {
    lines.push_back("span " + name);
    last_span = seconds;
    last_start = start;
  }
  void on_step(int64_t done, int64_t total) override {
    lines.push_back("step " + std::to_string(done) + "/" + std::to_string(total));
  }
  void on_note(const std::string& text) override { lines.push_back("note " + text); }
  std::vector<std::string> lines;
  double last_span = -1;
  std::chrono::steady_clock::time_point last_start;
};

TEST(Events, EveryCallReachesEverySinkInOrder) {
  Events events;
  auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
  events.add(a);
  events.add(nullptr);  // ignored
  events.add(b);
  events.counter("bytes_sent", 12);
  events.gauge("loss", 0.5, 3);
  events.step(3, 10);
  events.note("resumed");
  const std::vector<std::string> expected = {"counter bytes_sent 12.000000",
                                             "gauge loss 0.500000 @3", "step 3/10", "note resumed"};
  EXPECT_EQ(a->lines, expected);
  EXPECT_EQ(b->lines, expected);
}

TEST(Events, ATimerReportsItsSpanOnceWithTheTimeMeasured) {
  Events events;
  auto r = std::make_shared<Recorder>();
  events.add(r);
  {
    const auto before = std::chrono::steady_clock::now();
    auto timer = events.time("eval");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const double secs = timer.stop();
    EXPECT_GE(secs, 0.02);
    EXPECT_EQ(r->last_span, secs);
    EXPECT_GE(r->last_start, before);  // it started when the timer was made
    EXPECT_LE(r->last_start + std::chrono::milliseconds(20), std::chrono::steady_clock::now());
  }  // destruction after stop(): no second span
  EXPECT_EQ(r->lines, std::vector<std::string>{"span eval"});
  { auto timer = events.time("step"); }  // destruction alone reports
  EXPECT_EQ(r->lines.back(), "span step");
}

TEST(Events, ASpanOfSecondsEndsNow) {
  Events events;
  auto r = std::make_shared<Recorder>();
  events.add(r);
  const auto before = std::chrono::steady_clock::now();
  events.span("data", 0.5);
  const auto after = std::chrono::steady_clock::now();
  // start = now - 0.5 s, taken between `before` and `after`
  EXPECT_GE(r->last_start, before - std::chrono::milliseconds(500));
  EXPECT_LE(r->last_start, after - std::chrono::milliseconds(500));
  EXPECT_EQ(r->last_span, 0.5);
}

TEST(NoteSink, WritesOneKrabLinePerNote) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Events events;
  events.add(std::make_shared<NoteSink>(f));
  events.note("worker 2 was counted out");
  events.gauge("loss", 1, 1);  // not a note: nothing written
  std::rewind(f);
  char buf[128] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), "krab: worker 2 was counted out\n");
}

}  // namespace
}  // namespace krab::core
