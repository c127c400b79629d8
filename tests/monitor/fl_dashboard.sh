#!/usr/bin/env bash
# monitor.dashboard of `krab fl-server` end to end, in a real browser (Debian's chromium,
# headless) on loopback:
#   1. a real federation: one fl-server over TLS (central differential privacy, evaluating on
#      Fashion-MNIST's test split after every round) and three fl-clients, each on a third of
#      the training split, 20 local steps a round: a few rounds a second. The server runs far
#      more rounds than the test needs, so it is still serving when chromium looks; the test
#      stops the federation itself. The noise is small (sigma 0.02), so that the model learns
#      and the screenshot shows it: the epsilon this spends protects nothing, it is only a
#      number the page must draw;
#   2. once the server's history holds three evaluated rounds and three time points, the rounds
#      in it are checked against what the job fixes: every round selects the 3 clients, receives
#      an update of 4 bytes per parameter of the 784-32-32-10 MLP from each client that
#      reported, spends more of the privacy budget than the round before;
#   3. chromium loads the page, runs its script and dumps the DOM: every chart must hold points
#      from the running federation (the page writes each chart's count), and the status line
#      must state the last round's 3 selected clients and its bytes received, as in step 2;
#   4. chromium takes a screenshot, kept as a test artefact in ARTIFACTS (default: this
#      script's working directory): a PNG, large enough to hold drawn charts.
#
#   fl_dashboard.sh KRAB [PYTHON] [ARTIFACTS]
# Exit: 0 pass, 1 fail, 77 skipped (no chromium, Chart.js, openssl or Fashion-MNIST).
# Everything it starts is stopped on exit; everything it writes but the screenshot is in one
# temporary directory.
set -u
KRAB=$(realpath "${1:?usage: fl_dashboard.sh KRAB [PYTHON] [ARTIFACTS]}")
PY=${2:-python3}
ARTIFACTS=$(realpath -m "${3:-$PWD}")
FMNIST=/usr/share/datasets/fashion-mnist
command -v openssl >/dev/null || { echo "SKIPPED: no openssl"; exit 77; }
[ -f $FMNIST/train-images-idx3-ubyte.gz ] || [ -f $FMNIST/train-images-idx3-ubyte ] ||
  { echo "SKIPPED: no Fashion-MNIST in $FMNIST"; exit 77; }

# shellcheck source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh" krab-fldash
need_browser
# shellcheck disable=SC2034  # read by lib.sh's fail
FAIL_LOG=$WORK/server.log

# 1. The federation: a CA and the server's certificate for 127.0.0.1, a token per client.
cd "$WORK" || exit 1
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=krab-test-ca \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.ext -out server.pem 2>/dev/null || fail "openssl could not sign the certificate"
for i in 0 1 2; do echo "client-$i token-of-client-$i-$(openssl rand -hex 8)"; done >tokens.txt
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
cat >fed.yaml <<JOB
model: {name: mlp, hidden: 32}
data: {name: fashion-mnist, batch_size: 32}
train: {seed: 1, optimizer: {name: sgd, lr: 0.1, momentum: 0}}
federated:
  rounds: 100000
  clients: 3
  fraction: 1.0
  min_clients: 3
  local_steps: 20
  partition: iid
  round_deadline_s: 30
  wait_clients_s: 60
  address: 127.0.0.1:0
  tls_cert: $WORK/server.pem
  tls_key: $WORK/server.key
  tokens: $WORK/tokens.txt
  eval_data: $FMNIST
  dp: central
  dp_clip: 1
  dp_noise_multiplier: 0.02
monitor: {port: $PORT, dashboard: true}
checkpoint: {dir: $WORK/run}
JOB
"$KRAB" fl-server fed.yaml --port-file port >server.log 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do [ -s port ] && break; sleep 0.1; done
[ -s port ] || fail "the server did not listen"
grep -q "krab: dashboard at $URL/" server.log || fail "the server did not say where its page is"
for i in 0 1 2; do
  KRAB_FL_TOKEN=$(awk -v n="client-$i" '$1 == n {print $2}' tokens.txt) \
    "$KRAB" fl-client --server "127.0.0.1:$(cat port)" --ca ca.pem --data "$FMNIST" \
    --partition "$i/3" >"client$i.log" 2>&1 &
  PIDS+=($!)
done

# 2. The history: three evaluated rounds and three time points, checked against the job.
ready=""
for _ in $(seq 300); do
  if get "$URL/api/history" >history.json 2>/dev/null &&
     "$PY" -c 'import json, sys
h = json.load(open(sys.argv[1], encoding="utf-8"))
evaluated = [r for r in h["rounds"] if r["test_accuracy"] is not None and r["epsilon"] is not None]
sys.exit(0 if len(evaluated) >= 3 and sum(p["completed"] > 0 for p in h["points"]) >= 3 else 1)' history.json
  then ready=1; break; fi
  sleep 0.2
done
[ -n "$ready" ] || fail "the history at $URL/api/history never held 3 evaluated rounds and 3 time points"
"$PY" - history.json <<'PYEOF' || fail "the rounds in the history do not match the job"
import json, sys
h = json.load(open(sys.argv[1], encoding="utf-8"))
params = (784 * 32 + 32) + (32 * 32 + 32) + (32 * 10 + 10)  # the MLP's weights and biases
rounds = h["rounds"]
for r in rounds:
    assert r["selected"] == 3, r  # fraction 1.0 of 3 clients
    assert r["reported"] + r["dropped"] == 3, r
    # Each report: the update's 4-byte floats and a few bytes of framing; no data.
    assert r["reported"] * 4 * params <= r["bytes_received"] <= r["reported"] * (4 * params + 64), r
    assert 0 < r["test_accuracy"] <= 1, r
eps = [r["epsilon"] for r in rounds]
assert all(b > a > 0 for a, b in zip(eps, eps[1:])), eps  # every round spends more
numbers = [r["round"] for r in rounds]  # every round, in order (the page keeps the last 600)
assert numbers == list(range(numbers[0], numbers[0] + len(rounds))), numbers
print(f"history: {len(h['points'])} time points, rounds {numbers[0]}..{numbers[-1]}, "
      f"epsilon {eps[0]:.3g}..{eps[-1]:.3g}, {rounds[-1]['bytes_received']:.0f} bytes received in the last")
PYEOF

# 3. The page in chromium: its script fetches the history and draws; the DOM says what it drew.
browse --virtual-time-budget=5000 --dump-dom "$URL/" >dom.html ||
  fail "chromium could not load $URL/ ($(tail -n 3 chromium.log))"
"$PY" - dom.html <<'PYEOF' || fail "the page's charts do not hold the federation's data points"
import re, sys
dom = open(sys.argv[1], encoding="utf-8").read()
points = re.search(r'<body data-points="(\d+)"', dom)
counts = {k: int(v) for k, v in re.findall(r'id="count-(\w+)">(\d+) points<', dom)}
print(f"page: data-points {points.group(1) if points else None}, chart points {counts}")
assert points and int(points.group(1)) >= 3, "fewer than 3 time points drawn"
charts = ["rounds", "clients", "model", "bytes", "privacy", "time"]
missing = [c for c in charts if counts.get(c, 0) < 1]
assert not missing, f"charts without data points: {missing}"
assert counts["rounds"] >= 3 and counts["clients"] >= 3 and counts["privacy"] >= 3, counts
status = re.search(r"last round: (\d+) selected, (\d+) reported, (\d+) dropped, ([\d.]+) MB received", dom)
assert status, "the status line was not written"
selected, reported, dropped, mb = int(status[1]), int(status[2]), int(status[3]), float(status[4])
params = (784 * 32 + 32) + (32 * 32 + 32) + (32 * 10 + 10)
assert selected == 3 and reported + dropped == 3, status[0]
assert reported * 4 * params / 1e6 <= mb <= reported * (4 * params + 64) / 1e6, status[0]
assert re.search(r"test accuracy 0\.\d+", dom) and re.search(r"ε \d", dom), "no test metric or epsilon"
PYEOF

# 4. The screenshot, kept.
screenshot "$URL/" "$ARTIFACTS/fl-dashboard.png" 1400,1000
# The federation was still running all along: the server is stopped here, not finished.
kill -0 "${PIDS[0]}" 2>/dev/null || fail "the server ended before the test stopped it"
echo "PASS"
