// The training dashboard's page (monitor/dashboard.h): its cards and its draw(), in the frame
// every live page shares (monitor/live_page.h: the style, the helpers, the poll loop and what
// the page states for tests). One string, so the endpoint serves it without files.
#include "monitor/dashboard.h"

namespace krab::monitor {

namespace {

// The cards, each a canvas and its point count (the frame around them: live_page()).
constexpr const char* kCards = R"HTML(
  <div class="card"><h2>Loss and test accuracy <span class="count" id="count-loss">0</span></h2><canvas id="loss"></canvas></div>
  <div class="card"><h2>Samples per second (this node) <span class="count" id="count-rate">0</span></h2><canvas id="rate"></canvas></div>
  <div class="card"><h2>Step time per rank, last seconds <span class="count" id="count-breakdown">0</span></h2><canvas id="breakdown"></canvas></div>
  <div class="card"><h2>Traffic sent, MB/s <span class="count" id="count-traffic">0</span></h2><canvas id="traffic"></canvas></div>
  <div class="card"><h2>Resident memory per rank, MiB <span class="count" id="count-memory">0</span></h2><canvas id="memory"></canvas></div>
  <div class="card"><h2>Membership <span class="count" id="count-members">0</span></h2><canvas id="members"></canvas></div>
  <div class="card"><h2>Gradient noise scale and global batch (examples) <span class="count" id="count-noise">0</span></h2><canvas id="noise"></canvas></div>
)HTML";

// The script: the charts, and the draw() that the poll loop calls every second with the
// history (live_page.h's helpers: line, ds, series, count, status).
constexpr const char* kScript = R"JS(
const SHARES = ["compute", "communication", "waiting", "data", "optimizer", "other"];
const charts = {
  loss: line("loss", [ds("loss", 0), ds("test accuracy", 2, "y1")], {
    scales: { x: { type: "linear", title: { display: true, text: "seconds" } },
              y: { position: "left", title: { display: true, text: "loss" } },
              y1: { position: "right", min: 0, max: 1, grid: { drawOnChartArea: false },
                    title: { display: true, text: "accuracy" } } } }),
  rate: line("rate", [ds("samples/s", 4)]),
  noise: line("noise", [ds("B_simple", 6), Object.assign(ds("global batch", 0), { stepped: true })]),
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
  charts.noise.data.datasets[1].data = series(pts, t0, p => p.global_batch);
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
  status(`${pts.length} points · ${last.workers} workers · loss ${fmt(last.loss)} · ` +
    `${fmt(last.samples_per_sec)} samples/s · updated ${new Date(last.t * 1000).toLocaleTimeString()}`);
}
)JS";

}  // namespace

const std::string& dashboard_page() {
  static const std::string page = live_page("krab — live run", kCards, kScript);
  return page;
}

}  // namespace krab::monitor
