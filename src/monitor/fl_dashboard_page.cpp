// fl-server's page (monitor/fl_dashboard.h): its cards and its draw(), in the frame every live
// page shares (monitor/live_page.h). The status line states the last round's clients and bytes
// in words, for a reader and for tests/monitor/fl_dashboard.sh.
#include "monitor/fl_dashboard.h"

namespace krab::monitor {

namespace {

// The cards, each a canvas and its point count.
constexpr const char* kCards = R"HTML(
  <div class="card"><h2>Rounds completed <span class="count" id="count-rounds">0</span></h2><canvas id="rounds"></canvas></div>
  <div class="card"><h2>Clients per round <span class="count" id="count-clients">0</span></h2><canvas id="clients"></canvas></div>
  <div class="card"><h2>Global model on the server's test data <span class="count" id="count-model">0</span></h2><canvas id="model"></canvas></div>
  <div class="card"><h2>Model bytes per round, MB <span class="count" id="count-bytes">0</span></h2><canvas id="bytes"></canvas></div>
  <div class="card"><h2>Privacy budget spent, ε <span class="count" id="count-privacy">0</span></h2><canvas id="privacy"></canvas></div>
  <div class="card"><h2>Round time, seconds <span class="count" id="count-time">0</span></h2><canvas id="time"></canvas></div>
)HTML";

// The charts: the rounds over time (seconds, from the sampled points), the rest by round
// number (from the rounds' records).
constexpr const char* kCharts = R"JS(
function byRound(extra) {
  return { scales: Object.assign({ x: { type: "linear", title: { display: true, text: "round" } } },
                                 extra || {}) };
}
const stepped = (label, i) => Object.assign(ds(label, i), { stepped: true });
const charts = {
  rounds: line("rounds", [stepped("completed", 4), stepped("failed", 2)]),
  // Dashed where lines often coincide (every selected client reported and was counted).
  clients: line("clients", [stepped("selected", 0),
                            Object.assign(stepped("reported", 1), { borderDash: [8, 4] }),
                            Object.assign(stepped("counted", 4), { borderDash: [2, 4] }),
                            stepped("dropped", 2)],
                  byRound({ y: { beginAtZero: true, grace: "10%", ticks: { precision: 0 } } })),
  model: line("model", [ds("test metric", 2, "y1"), ds("clients' training loss", 0)], byRound({
    y: { position: "left", title: { display: true, text: "training loss" } },
    y1: { position: "right", grid: { drawOnChartArea: false },
          title: { display: true, text: "test metric" } } })),
  bytes: line("bytes", [ds("received from clients", 1), ds("sent to clients", 3)],
               byRound({ y: { beginAtZero: true } })),
  privacy: line("privacy", [ds("ε spent", 7)], byRound()),
  time: line("time", [ds("seconds", 5)], byRound())
};
)JS";

// draw(): each chart's datasets from the history; its count is its first dataset's points
// (the model's: the evaluations). Then the status line.
constexpr const char* kDraw = R"JS(
function put(name, data) {
  data.forEach((d, i) => { charts[name].data.datasets[i].data = d; });
  count(name, data[0].length);
}
const fmt = v => v === null || v === undefined ? "—" : Number(v).toPrecision(4);
function latest(rounds, key) {
  for (let i = rounds.length - 1; i >= 0; --i) if (rounds[i][key] !== null) return rounds[i][key];
  return null;
}
function draw(h) {
  const pts = h.points, rounds = h.rounds;
  const t0 = pts.length > 0 ? pts[0].t : 0;
  put("rounds", [series(pts, t0, p => p.completed), series(pts, t0, p => p.failed)]);
  const r = f => xy(rounds, p => p.round, f);
  put("clients", [r(p => p.selected), r(p => p.reported), r(p => p.counted), r(p => p.dropped)]);
  const accuracy = r(p => p.test_accuracy), loss = r(p => p.test_loss);
  charts.model.data.datasets[0].label = accuracy.length > 0 || loss.length === 0 ? "test accuracy" : "test loss";
  put("model", [accuracy.length > 0 ? accuracy : loss, r(p => p.train_loss)]);
  put("bytes", [r(p => p.bytes_received / 1e6), r(p => p.bytes_sent / 1e6)]);
  put("privacy", [r(p => p.epsilon)]);
  put("time", [r(p => p.seconds)]);
  for (const c of Object.values(charts)) c.update();
  if (rounds.length === 0) { status("waiting for the first round…"); return; }
  const last = rounds[rounds.length - 1];
  const acc = latest(rounds, "test_accuracy"), tl = latest(rounds, "test_loss");
  const metric = acc !== null ? `test accuracy ${fmt(acc)}` : tl !== null ? `test loss ${fmt(tl)}` : "not evaluated";
  const eps = latest(rounds, "epsilon");
  status(`round ${last.round} · ${last.completed} completed, ${last.failed} failed · ` +
    `last round: ${last.selected} selected, ${last.reported} reported, ${last.dropped} dropped, ` +
    `${(last.bytes_received / 1e6).toPrecision(6)} MB received · ${metric} · ` +
    `ε ${eps === null ? "— (no DP)" : fmt(eps)} · updated ${new Date(last.t * 1000).toLocaleTimeString()}`);
}
)JS";

}  // namespace

const std::string& fl_dashboard_page() {
  static const std::string page =
      live_page("krab — federated server", kCards, std::string(kCharts) + kDraw);
  return page;
}

}  // namespace krab::monitor
