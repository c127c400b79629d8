#include "core/events.h"

namespace krab::core {

void Events::add(std::shared_ptr<EventSink> sink) {
  if (sink) sinks_.push_back(std::move(sink));
}

void Events::counter(const std::string& name, double delta) const {
  for (const auto& s : sinks_) s->on_counter(name, delta);
}

void Events::gauge(const std::string& name, double value, int64_t step) const {
  for (const auto& s : sinks_) s->on_gauge(name, value, step);
}

void Events::span(const std::string& name, double seconds) const {
  const auto start = std::chrono::steady_clock::now() -
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  span(name, start, seconds);
}

void Events::span(const std::string& name, std::chrono::steady_clock::time_point start,
                  double seconds) const {
  for (const auto& s : sinks_) s->on_span(name, start, seconds);
}

void Events::step(int64_t done, int64_t total) const {
  for (const auto& s : sinks_) s->on_step(done, total);
}

void Events::note(const std::string& text) const {
  for (const auto& s : sinks_) s->on_note(text);
}

Events::Timer::Timer(const Events& events, std::string name)
    : events_(&events), name_(std::move(name)), start_(std::chrono::steady_clock::now()) {}

double Events::Timer::stop() {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (!stopped_) {
    stopped_ = true;
    events_->span(name_, start_, secs);
  }
  return secs;
}

void NoteSink::on_note(const std::string& text) {
  std::fprintf(out_, "krab: %s\n", text.c_str());
  std::fflush(out_);
}

}  // namespace krab::core
