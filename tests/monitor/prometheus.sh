#!/usr/bin/env bash
# monitor.port end to end, with a real Prometheus (Debian's prometheus) on loopback:
#   1. a port in use (Prometheus's own) is refused before training: exit 2, the message names
#      monitor.port, no model.pt is written;
#   2. Prometheus scrapes a 2-worker CNN run (examples/fashion_cnn.yaml, 150 steps paced by a
#      60 ms straggler: at least 9 s of training however fast the machine, about 20 s on a
#      loaded one) every second through krab's /metrics; afterwards its query API must show
#      both ranks, and `sum(rate(krab_train_samples_total[W]))` over the part of the run where
#      the counter moved must agree with the report's samples_per_sec within 10%;
#   3. the scraped text names no path of the run (nothing secret, no directory).
#
#   prometheus.sh KRAB [PYTHON]
# Exit: 0 pass, 1 fail, 77 skipped (no prometheus binary: scripts/setup.sh installs it).
# Everything it starts is stopped on exit; everything it writes is in one temporary directory.
set -u
KRAB=$(realpath "${1:?usage: prometheus.sh KRAB [PYTHON]}")
PY=${2:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
JOB=$HERE/../../examples/fashion_cnn.yaml
STEPS=${STEPS:-150}
command -v prometheus >/dev/null || { echo "SKIPPED: no prometheus (scripts/setup.sh installs it)"; exit 77; }

# shellcheck source=lib.sh
. "$HERE/lib.sh" krab-prom

KPORT=$(free_port)
PPORT=$(free_port)
cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: krab
    static_configs: [{targets: ['127.0.0.1:$KPORT']}]
EOF
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PPORT" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
PROM=http://127.0.0.1:$PPORT
for _ in $(seq 100); do
  get "$PROM/-/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
get "$PROM/-/ready" >/dev/null 2>&1 || { cat "$WORK/prometheus.log"; fail "prometheus did not start"; }

# 1. Prometheus holds PPORT: krab must refuse it before any worker starts.
T0=$(date +%s.%N)
"$KRAB" train "$JOB" --set parallel.workers=2 --set train.steps=5 --set monitor.port="$PPORT" \
  --set checkpoint.dir="$WORK/busy" >"$WORK/busy.log" 2>&1
RC=$?
T1=$(date +%s.%N)
[[ $RC == 2 ]] || { cat "$WORK/busy.log"; fail "port in use: exit $RC, expected 2"; }
grep -q "monitor.port $PPORT: the port is in use on 127.0.0.1" "$WORK/busy.log" ||
  { cat "$WORK/busy.log"; fail "port in use: the message does not name monitor.port"; }
[[ -z $(find "$WORK" -name model.pt) ]] || fail "port in use: a model.pt was written"
echo "port in use: exit 2 after $("$PY" -c "print(f'{$T1 - $T0:.1f}')") s: $(grep -o 'monitor.port.*' "$WORK/busy.log")"

# 2. The run, scraped. A copy of /metrics midway is kept for the checks of step 3.
START=$(date +%s)
"$KRAB" train "$JOB" --set parallel.workers=2 --set train.steps="$STEPS" \
  --set train.slow_rank=1 --set train.slow_delay_ms=60 --set train.eval_examples=500 \
  --set monitor.port="$KPORT" --set checkpoint.dir="$WORK/run" --report "$WORK/report.json" \
  >"$WORK/train.log" 2>&1 &
KRAB_PID=$!
PIDS+=($KRAB_PID)
for _ in $(seq 600); do
  body=$(get "http://127.0.0.1:$KPORT/metrics" 2>/dev/null)
  if grep -q '^krab_train_samples_total{node="0",rank="1"} [1-9]' <<<"$body"; then
    sleep 3
    get "http://127.0.0.1:$KPORT/metrics" >"$WORK/scrape.txt" 2>/dev/null
    break
  fi
  kill -0 "$KRAB_PID" 2>/dev/null || break
  sleep 0.2
done
wait "$KRAB_PID"
RC=$?
END=$(date +%s)
[[ $RC == 0 ]] || { cat "$WORK/train.log"; fail "the run ended with $RC"; }
grep -q "krab: metrics at http://127.0.0.1:$KPORT/metrics" "$WORK/train.log" ||
  fail "the launcher did not say where the metrics are"
[[ -s $WORK/scrape.txt ]] || fail "no scrape of /metrics while the run lasted"

# 3. What was served names no path of the run.
if grep -q -e "$WORK" -e '/tmp' -e 'krab-monitor' "$WORK/scrape.txt"; then
  fail "/metrics shows a path: $(grep -e "$WORK" -e /tmp -e krab-monitor "$WORK/scrape.txt" | head -3)"
fi

"$PY" - "$PROM" "$START" "$END" "$WORK/report.json" "$WORK/scrape.txt" <<'EOF' || exit 1
import json, sys, urllib.parse, urllib.request

prom, start, end, report_path, scrape_path = sys.argv[1:]
start, end = int(start), int(end) + 1

def query(path, **params):
    url = f"{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
    answer = json.load(urllib.request.urlopen(url, timeout=10))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]

def fail(why):
    print("FAIL:", why, file=sys.stderr)
    sys.exit(1)

report = json.load(open(report_path))
expected = report["samples_per_sec"]
series = query("query_range", query="sum(krab_train_samples_total)", start=start, end=end, step=1)
if not series:
    fail("Prometheus scraped no krab_train_samples_total")
points = [(float(t), float(v)) for t, v in series[0]["values"]]
top = max(v for _, v in points)
# The report counts from the end of its warm-up (10 steps of 150: a fifteenth of the samples)
# to the last step. The window here: from the first scrape past a tenth of the samples to the
# last one before the final twentieth (the last snapshot of the steps may come only after the
# final evaluation, which the report leaves out). The load of a shared machine varies within a
# run: the wider the window, the closer to the report.
moving = [t for t, v in points if 0.1 * top <= v <= 0.95 * top]
if len(moving) < 5:
    fail(f"too few scrapes while training ({len(moving)}): {points}")
lo, hi = moving[0], moving[-1]
ranks = query("query", query="count(krab_train_samples_total)", time=hi)
if not ranks or float(ranks[0]["value"][1]) != 2:
    fail(f"Prometheus does not hold two ranks' samples: {ranks}")
window = int(1000 * (hi - lo))
rate = query("query", query=f"sum(rate(krab_train_samples_total[{window}ms]))", time=hi)
measured = float(rate[0]["value"][1])
gap = abs(measured - expected) / expected
print(f"samples/s: Prometheus rate over {window / 1000:.0f} s = {measured:.1f}, report = "
      f"{expected:.1f}, difference {100 * gap:.1f}%")
print(f"samples total: {top:.0f} (report: {report.get('steps', '?')} steps)")
if gap > 0.10:
    fail("Prometheus's rate and the report's samples/s differ by more than 10%")
scrape = open(scrape_path).read()
for family in ["krab_train_steps_total", "krab_train_step_seconds_bucket",
               "krab_train_phase_seconds_total", "krab_comm_bytes_total",
               "krab_memory_rss_bytes", "krab_bottleneck_share", "krab_bottleneck_slowest_rank"]:
    if family not in scrape:
        fail(f"the scrape has no {family}")
# A monitored run of 2 workers also estimates the gradient noise scale (train/noise_scale.h).
noise = report.get("gradient_noise_scale")
if not noise or not noise["b_simple"] > 0 or noise["steps"] < 100:
    fail(f"the report's gradient_noise_scale is {noise}")
print(f"gradient noise scale: B_simple {noise['b_simple']:.0f} examples over {noise['steps']} steps")
EOF
echo "PASS: $((END - START)) s run"
