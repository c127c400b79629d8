#!/usr/bin/env bash
# monitor.dashboard end to end, in a real browser (Debian's chromium, headless) on loopback:
#   1. a 2-worker run (a small MLP paced by a 40 ms straggler: about 20 steps a second, an
#      evaluation every 40 steps) serves the page at / of monitor.port;
#   2. once its history holds points with a rate and a loss, chromium loads the page, runs its
#      script and dumps the DOM: every chart must hold data points from the running job
#      (the page writes each chart's count and <body data-points>);
#   3. chromium takes a screenshot, kept as a test artefact in ARTIFACTS (default: this
#      script's working directory): a PNG, large enough to hold drawn charts.
#
#   dashboard.sh KRAB [PYTHON] [ARTIFACTS]
# Exit: 0 pass, 1 fail, 77 skipped (no chromium or no Chart.js: scripts/setup.sh installs both).
# Everything it starts is stopped on exit; everything it writes but the screenshot is in one
# temporary directory.
set -u
KRAB=$(realpath "${1:?usage: dashboard.sh KRAB [PYTHON] [ARTIFACTS]}")
PY=${2:-python3}
ARTIFACTS=${3:-$PWD}

# shellcheck source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh" krab-dash
need_browser
FAIL_LOG=$WORK/krab.log

PORT=$(free_port)
URL=http://127.0.0.1:$PORT
cat >"$WORK/job.yaml" <<JOB
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 32}
train: {steps: 2000, eval_every: 40, slow_rank: 1, slow_delay_ms: 40,
        optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 2}
comm: {timeout_s: 30}
monitor: {port: $PORT, dashboard: true}
checkpoint: {dir: $WORK/run}
JOB
"$KRAB" train "$WORK/job.yaml" >"$WORK/krab.log" 2>&1 &
PIDS+=($!)

# The history needs a few seconds of training: points with a rate, a loss and an accuracy.
ready=""
for _ in $(seq 150); do
  if get "$URL/api/history" >"$WORK/history.json" 2>/dev/null &&
     "$PY" - "$WORK/history.json" <<'PYEOF'
import json, sys
points = json.load(open(sys.argv[1]))["points"]
ok = (sum(p["samples_per_sec"] is not None for p in points) >= 3 and
      any(p["loss"] is not None for p in points) and any(p["accuracy"] is not None for p in points))
sys.exit(0 if ok else 1)
PYEOF
  then ready=1; break; fi
  sleep 0.2
done
[ -n "$ready" ] || fail "the history at $URL/api/history never held rates, a loss and an accuracy"
echo "history: $("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["points"]))' "$WORK/history.json") points"

# 2. The page in chromium: its script fetches the history and draws; the DOM says what it drew.
browse --virtual-time-budget=5000 --dump-dom "$URL/" >"$WORK/dom.html" ||
  fail "chromium could not load $URL/ ($(tail -n 3 "$WORK/chromium.log"))"
"$PY" - "$WORK/dom.html" <<'PYEOF' || fail "the page's charts do not hold the run's data points"
import re, sys
dom = open(sys.argv[1]).read()
points = re.search(r'<body data-points="(\d+)"', dom)
counts = dict(re.findall(r'id="count-(\w+)">(\d+) points<', dom))
print(f"page: data-points {points.group(1) if points else None}, chart points {counts}")
charts = ["loss", "rate", "breakdown", "traffic", "memory", "members", "noise"]
assert points and int(points.group(1)) >= 3, "fewer than 3 points drawn"
missing = [c for c in charts if int(counts.get(c, 0)) < 1]
assert not missing, f"charts without data points: {missing}"
assert int(counts["breakdown"]) == 2, "the breakdown should show the 2 ranks"
assert "workers · loss" in dom, "the status line was not written"
PYEOF

# 3. The screenshot, kept.
screenshot "$URL/" "$ARTIFACTS/dashboard.png" 1400,1300
echo "PASS"
