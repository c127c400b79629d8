// What every live page of a krab endpoint shares (monitor.dashboard, docs/monitoring.md): the
// training launcher's page (monitor/dashboard.h) and fl-server's (monitor/fl_dashboard.h) are
// each a few cards and a draw() of their own on top of these pieces.
//
//   - PointLog: the points a page draws, bounded (the oldest go), read as JSON by the endpoint's
//     threads while one writer adds;
//   - Sampler: a thread that takes a point every period (once a second) until destroyed;
//   - serve_live_page(): the three routes, `/` (the page), `/chart.js` (Chart.js as Debian's
//     libjs-chart.js installs it: the page needs no internet) and `/api/history` (the JSON the
//     page polls every second). Without the package it refuses, naming monitor.dashboard, so
//     that the command ends with exit 2 before it starts anything;
//   - live_page(): the HTML around a page's cards and script: the style, the status line, the
//     chart helpers and the poll loop.
//
// The pages state what they drew, for tests and scripts: each chart's number of data points in
// its <span class="count" id="count-NAME">N points</span>, and <body data-points="N"> after
// each redraw (the points of the history the page last drew).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace krab::monitor {

class Endpoint;

// A bounded log of JSON points. Thread-safe.
class PointLog {
 public:
  explicit PointLog(size_t capacity) : capacity_(capacity) {}
  void add(nlohmann::json point);
  // The last `last` points, oldest first, as a JSON array.
  nlohmann::json last(size_t last) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::deque<nlohmann::json> points_;
};

// The wall clock as the pages' x axis counts it: unix seconds.
double unix_now();

// Calls `sample(unix_now())` at once and then every `period` on its own thread, until
// destroyed (the destructor wakes it and joins: no wait for the rest of a period). An
// exception from `sample` is printed on stderr, once for each new message, and sampling goes
// on: a page with a gap beats a launcher that dies of its dashboard.
class Sampler {
 public:
  Sampler(std::chrono::milliseconds period, std::function<void(double)> sample);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

 private:
  void run();

  std::chrono::milliseconds period_;
  std::function<void(double)> sample_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is set
};

// Chart.js as libjs-chart.js installs it. Throws krab::InvalidArgument naming
// monitor.dashboard and the package when it is not there.
std::string read_chart_js();

// Routes `/` (`page`), `/chart.js` (read once, now: throws as read_chart_js does, before any
// route is added) and `/api/history` (`history()`'s text, called on the endpoint's threads:
// it must be thread-safe and outlive the endpoint's serving).
void serve_live_page(Endpoint& endpoint, const std::string& page,
                     std::function<std::string()> history);

// A whole page: `title` in the tab and the heading, `cards` (HTML: the chart cards, each
// `<div class="card"><h2>… <span class="count" id="count-NAME">0</span></h2><canvas
// id="NAME"></canvas></div>`) in the grid, and `script`, which runs after the helpers:
//   COLOURS; line(id, datasets, extraOptions) -> a Chart with a linear x axis;
//   ds(label, colourIndex, axis) -> an empty dataset; series(points, x0, f) -> [{x, y}] of the
//   points where f gives a value (x: seconds since x0, from each point's t);
//   xy(points, fx, fy) -> [{x, y}] where both give a value; count(name, n);
//   status(text).
// `script` must define draw(history): the poll loop fetches /api/history every second, calls
// draw(), then sets <body data-points> to history.points.length.
std::string live_page(const std::string& title, const std::string& cards,
                      const std::string& script);

}  // namespace krab::monitor
