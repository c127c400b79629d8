#include "monitor/live_page.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/errors.h"
#include "monitor/endpoint.h"

namespace krab::monitor {
namespace {

constexpr const char* kChartJs = "/usr/share/javascript/chart.js/chart.min.js";

// The head's style: a grid of cards, each a title with its point count over a canvas.
constexpr const char* kStyle = R"CSS(
  body { font-family: system-ui, sans-serif; margin: 16px; background: #fafafa; color: #222; }
  h1 { font-size: 18px; margin: 0 0 4px 0; }
  #status { font-size: 13px; color: #555; margin-bottom: 12px; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 14px; }
  .card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px; }
  .card h2 { font-size: 14px; margin: 0 0 6px 0; font-weight: 600; }
  .count { font-size: 11px; color: #888; font-weight: normal; }
  canvas { width: 100% !important; height: 240px !important; }
)CSS";

// The helpers every page's script draws with (live_page.h lists them). Animation is off: a
// chart redrawn every second should show the numbers, not move towards them.
constexpr const char* kHelpers = R"JS(
"use strict";
const COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac",
                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
Chart.defaults.animation = false;
function line(id, datasets, extra) {
  return new Chart(document.getElementById(id), {
    type: "line",
    data: { datasets: datasets },
    options: Object.assign({
      parsing: false, normalized: true, spanGaps: true,
      elements: { point: { radius: 0 } },
      scales: { x: { type: "linear", title: { display: true, text: "seconds" } } }
    }, extra || {})
  });
}
function ds(label, i, axis) {
  return { label: label, data: [], borderColor: COLOURS[i % COLOURS.length],
           backgroundColor: COLOURS[i % COLOURS.length], yAxisID: axis || "y", borderWidth: 2 };
}
function xy(points, fx, fy) {
  const out = [];
  for (const p of points) {
    const x = fx(p), y = fy(p);
    if (x !== null && x !== undefined && y !== null && y !== undefined) out.push({ x: x, y: y });
  }
  return out;
}
function series(points, t0, f) { return xy(points, p => p.t - t0, f); }
function count(id, n) { document.getElementById("count-" + id).textContent = n + " points"; }
function status(text) { document.getElementById("status").textContent = text; }
)JS";

// The poll loop: the history every second, drawn by the page's own draw().
constexpr const char* kPoll = R"JS(
async function poll() {
  try {
    const r = await fetch("/api/history", { cache: "no-store" });
    if (r.ok) {
      const h = await r.json();
      draw(h);
      document.body.dataset.points = String(h.points.length);
    }
  } catch (e) {
    status("the endpoint does not answer (finished?)");
  }
  setTimeout(poll, 1000);
}
poll();
)JS";

}  // namespace

void PointLog::add(nlohmann::json point) {
  std::lock_guard<std::mutex> lock(mu_);
  points_.push_back(std::move(point));
  if (points_.size() > capacity_) points_.pop_front();
}

nlohmann::json PointLog::last(size_t last) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json points = nlohmann::json::array();
  const size_t first = points_.size() > last ? points_.size() - last : 0;
  for (size_t i = first; i < points_.size(); ++i) points.push_back(points_[i]);
  return points;
}

size_t PointLog::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return points_.size();
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Sampler::Sampler(std::chrono::milliseconds period, std::function<void(double)> sample)
    : period_(period), sample_(std::move(sample)), thread_([this] { run(); }) {}

Sampler::~Sampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Sampler::run() {
  std::string last_error;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    try {
      sample_(unix_now());
    } catch (const std::exception& e) {
      if (e.what() != last_error)
        std::fprintf(stderr, "krab: warning: the dashboard could not sample: %s\n", e.what());
      last_error = e.what();
    }
    lock.lock();
    wake_.wait_for(lock, period_, [this] { return stop_; });
  }
}

std::string read_chart_js() {
  std::ifstream in(kChartJs, std::ios::binary);
  KRAB_CHECK_ARG(in.good(), "monitor.dashboard: Chart.js is not installed (", kChartJs,
                 "; Debian package libjs-chart.js, which scripts/setup.sh installs)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void serve_live_page(Endpoint& endpoint, const std::string& page,
                     std::function<std::string()> history) {
  auto chart = std::make_shared<const std::string>(read_chart_js());
  endpoint.route("/", "text/html; charset=utf-8", [page] { return page; });
  endpoint.route("/chart.js", "text/javascript; charset=utf-8", [chart] { return *chart; });
  endpoint.route("/api/history", "application/json", std::move(history));
}

std::string live_page(const std::string& title, const std::string& cards,
                      const std::string& script) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + title +
         "</title>\n<script src=\"/chart.js\"></script>\n<style>" + kStyle +
         "</style>\n</head>\n<body data-points=\"0\">\n<h1>" + title +
         "</h1>\n<div id=\"status\">waiting for the first numbers…</div>\n<div class=\"grid\">\n" +
         cards + "</div>\n<script>" + kHelpers + script + kPoll + "</script>\n</body>\n</html>\n";
}

}  // namespace krab::monitor
