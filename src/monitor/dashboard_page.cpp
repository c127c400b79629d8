// The dashboard's page (monitor/dashboard.h): HTML, style and script in one string, so the
// endpoint serves it without files. Chart.js comes from the endpoint's /chart.js.
//
// For tests and scripts the page states what it drew: <body data-points="N"> after each
// redraw, and each chart's number of data points in its <span class="count">.
#include "monitor/dashboard.h"

namespace krab::monitor {

namespace {

// The document: head (Chart.js, style) and the cards, each a canvas and its point count.
constexpr const char* kMarkup = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>krab — live run</title>
<script src="/chart.js"></script>
<style>
  body { font-family: system-ui, sans-serif; margin: 16px; background: #fafafa; color: #222; }
  h1 { font-size: 18px; margin: 0 0 4px 0; }
  #status { font-size: 13px; color: #555; margin-bottom: 12px; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 14px; }
  .card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px; }
  .card h2 { font-size: 14px; margin: 0 0 6px 0; font-weight: 600; }
  .count { font-size: 11px; color: #888; font-weight: normal; }
  canvas { width: 100% !important; height: 240px !important; }
</style>
</head>
<body data-points="0">
<h1>krab — live run</h1>
<div id="status">waiting for the first numbers…</div>
<div class="grid">
  <div class="card"><h2>Loss and test accuracy <span class="count" id="count-loss">0</span></h2><canvas id="loss"></canvas></div>
  <div class="card"><h2>Samples per second (this node) <span class="count" id="count-rate">0</span></h2><canvas id="rate"></canvas></div>
  <div class="card"><h2>Step time per rank, last seconds <span class="count" id="count-breakdown">0</span></h2><canvas id="breakdown"></canvas></div>
  <div class="card"><h2>Traffic sent, MB/s <span class="count" id="count-traffic">0</span></h2><canvas id="traffic"></canvas></div>
  <div class="card"><h2>Resident memory per rank, MiB <span class="count" id="count-memory">0</span></h2><canvas id="memory"></canvas></div>
  <div class="card"><h2>Membership <span class="count" id="count-members">0</span></h2><canvas id="members"></canvas></div>
  <div class="card"><h2>Gradient noise scale (examples) <span class="count" id="count-noise">0</span></h2><canvas id="noise"></canvas></div>
</div>)HTML";

// The script: the charts, and a poll of /api/history every second that redraws them all.
constexpr const char* kScript = R"JS(
"use strict";
const SHARES = ["compute", "communication", "waiting", "data", "optimizer", "other"];
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
const charts = {
  loss: line("loss", [ds("loss", 0), ds("test accuracy", 2, "y1")], {
    scales: { x: { type: "linear", title: { display: true, text: "seconds" } },
              y: { position: "left", title: { display: true, text: "loss" } },
              y1: { position: "right", min: 0, max: 1, grid: { drawOnChartArea: false },
                    title: { display: true, text: "accuracy" } } } }),
  rate: line("rate", [ds("samples/s", 4)]),
  noise: line("noise", [ds("B_simple", 6)]),
  traffic: line("traffic", [ds("MB/s", 1)]),
  memory: line("memory", []),
  members: line("members", [Object.assign(ds("workers", 0), { stepped: true }),
                            Object.assign(ds("generation", 3), { stepped: true })]),
  breakdown: new Chart(document.getElementById("breakdown"), {
    type: "bar",
    data: { labels: [], datasets: SHARES.map((s, i) => ({ label: s, data: [],
            backgroundColor: COLOURS[i] })) },
    options: { indexAxis: "y", scales: { x: { stacked: true, min: 0, max: 100,
               title: { display: true, text: "% of the step" } }, y: { stacked: true } } }
  })
};
function series(points, t0, f) {
  const out = [];
  for (const p of points) { const v = f(p); if (v !== null && v !== undefined) out.push({ x: p.t - t0, y: v }); }
  return out;
}
function count(id, n) { document.getElementById("count-" + id).textContent = n + " points"; }
function draw(h) {
  const pts = h.points;
  if (pts.length === 0) return;
  const t0 = pts[0].t, last = pts[pts.length - 1];
  const loss = series(pts, t0, p => p.loss), acc = series(pts, t0, p => p.accuracy);
  charts.loss.data.datasets[0].data = loss;
  charts.loss.data.datasets[1].data = acc;
  count("loss", loss.length + acc.length);
  const noise = series(pts, t0, p => p.noise_scale);
  charts.noise.data.datasets[0].data = noise;
  count("noise", noise.length);
  const rate = series(pts, t0, p => p.samples_per_sec);
  charts.rate.data.datasets[0].data = rate;
  count("rate", rate.length);
  const traffic = series(pts, t0, p => p.bytes_per_sec === null ? null : p.bytes_per_sec / 1e6);
  charts.traffic.data.datasets[0].data = traffic;
  count("traffic", traffic.length);
  const ranks = [...new Set(pts.flatMap(p => p.ranks.map(r => r.rank)))].sort((a, b) => a - b);
  charts.memory.data.datasets = ranks.map((r, i) => Object.assign(ds("rank " + r, i), {
    data: series(pts, t0, p => { const x = p.ranks.find(q => q.rank === r); return x ? x.rss_bytes / 1048576 : null; })
  }));
  count("memory", charts.memory.data.datasets.reduce((n, d) => n + d.data.length, 0));
  const workers = series(pts, t0, p => p.workers), gens = series(pts, t0, p => p.generation);
  charts.members.data.datasets[0].data = workers;
  charts.members.data.datasets[1].data = gens;
  count("members", workers.length);
  const rows = last.ranks.filter(r => r.compute !== undefined);
  charts.breakdown.data.labels = rows.map(r => "rank " + r.rank);
  SHARES.forEach((s, i) => { charts.breakdown.data.datasets[i].data = rows.map(r => 100 * r[s]); });
  count("breakdown", rows.length);
  for (const c of Object.values(charts)) c.update();
  const fmt = v => v === null || v === undefined ? "—" : Number(v).toPrecision(4);
  document.getElementById("status").textContent =
    `${pts.length} points · ${last.workers} workers · loss ${fmt(last.loss)} · ` +
    `${fmt(last.samples_per_sec)} samples/s · updated ${new Date(last.t * 1000).toLocaleTimeString()}`;
  document.body.dataset.points = String(pts.length);
}
async function poll() {
  try {
    const r = await fetch("/api/history", { cache: "no-store" });
    if (r.ok) draw(await r.json());
  } catch (e) {
    document.getElementById("status").textContent = "the run's endpoint does not answer (finished?)";
  }
  setTimeout(poll, 1000);
}
poll();
)JS";

}  // namespace

const std::string& dashboard_page() {
  static const std::string page =
      std::string(kMarkup) + "\n<script>" + kScript + "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace krab::monitor
