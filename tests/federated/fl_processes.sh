#!/usr/bin/env bash
# End-to-end federated run with real processes on loopback over TLS:
#   - one `krab fl-server` (under strace, to prove it never opens the clients' data) and five
#     `krab fl-client`s, each on its own partition of a copy of Fashion-MNIST's training files;
#   - one client is killed (SIGKILL) while the rounds run: the run still finishes, and the
#     report names it as dropped;
#   - clients with an unknown token, an expired token, a token another live client holds, or a
#     CA that did not sign the server's certificate are refused with a clear message and a
#     non-zero exit, and the server keeps serving the others;
#   - what crosses the wire is the size of model updates, not of data;
#   - the clients' tokens come from a file (--token-file), the environment (KRAB_FL_TOKEN) and
#     the command line (--token, with a warning); a missing or empty token file is exit 2 naming
#     it, before anything connects;
#   - plain mode: after two rounds the server's /metrics (monitor.port) counts them.
# Usage: fl_processes.sh KRAB [secure]
set -euo pipefail
KRAB=$(readlink -f "$1")
MODE=${2:-plain}
FMNIST=/usr/share/datasets/fashion-mnist
[[ -f $FMNIST/train-images-idx3-ubyte.gz || -f $FMNIST/train-images-idx3-ubyte ]] || {
  echo "SKIP: no Fashion-MNIST in $FMNIST"; exit 77; }
command -v openssl >/dev/null || { echo "SKIP: no openssl"; exit 77; }

T=$(mktemp -d -t krab-flproc.XXXXXX)  # under $TMPDIR
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT
[[ -n ${KRAB_KEEP_LOGS:-} ]] && trap "echo logs in $T" EXIT
fail() { echo "FAIL: $*"; for f in "$T"/*.log; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }

# ---- certificates: a CA, a server certificate for 127.0.0.1/localhost, and a rogue CA ----
cd "$T"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=krab-test-ca \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > san.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.ext -out server.pem 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rogue-ca \
  -keyout rogue.key -out rogue.pem 2>/dev/null

# ---- tokens: five clients and one whose token expired in 2001 ----
: > tokens.txt
for i in 0 1 2 3 4; do echo "client-$i token-of-client-$i-$(openssl rand -hex 8)" >> tokens.txt; done
echo "old-client expired-token-0123456789 1000000000" >> tokens.txt
token() { awk -v n="client-$1" '$1 == n {print $2}' tokens.txt; }

# ---- data: the clients' copy of the training files; the server gets only t10k ----
mkdir clientdata serverdata
cp "$FMNIST"/train-* clientdata/
cp "$FMNIST"/t10k-* serverdata/
cp "$FMNIST"/t10k-* clientdata/   # the loader wants all four files; clients use train only

SECURE=false
[[ $MODE == secure ]] && SECURE=true
cat > fed.yaml <<EOF
name: flproc
model: {name: mlp, hidden: 64}
data: {name: fashion-mnist, batch_size: 32}
train: {seed: 1, optimizer: {name: sgd, lr: 0.1, momentum: 0}}
federated:
  rounds: 5
  clients: 5
  fraction: 1.0
  min_clients: 3
  local_steps: 300
  partition: iid
  round_deadline_s: 10
  wait_clients_s: 60
  address: 127.0.0.1:0
  tls_cert: $T/server.pem
  tls_key: $T/server.key
  tokens: $T/tokens.txt
  eval_data: $T/serverdata
  secure_aggregation: $SECURE
  secagg_threshold: 0.6
checkpoint: {dir: $T/run}
EOF

# ---- bad server input: exit 2 naming the key or file, before anything listens ----
set +e
expect_refusal() {  # WHAT PATTERN ARGS...
  local what=$1 pattern=$2; shift 2
  "$KRAB" fl-server "$@" > refusal.log 2>&1
  local code=$?
  [[ $code == 2 ]] || fail "$what: exit $code, want 2"
  grep -q -- "$pattern" refusal.log || fail "$what: message lacks '$pattern': $(cat refusal.log)"
}
printf 'federated: {roundz: 3}\n' > typo.yaml
expect_refusal "unknown key" "federated.roundz" typo.yaml
expect_refusal "no tokens" "federated.tokens" fed.yaml --set federated.tokens=
expect_refusal "tiny max message" "federated.max_message_mb" fed.yaml --set federated.max_message_mb=0.01
expect_refusal "missing certificate" "does not exist" fed.yaml --set "federated.tls_cert=$T/none.pem"
set -e

STRACE=()
if command -v strace >/dev/null; then STRACE=(strace -f -qq -e trace=open,openat -o "$T/strace.out"); fi
# The server serves its rounds' metrics (monitor.port, docs/monitoring.md) on a free loopback port.
MPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${STRACE[@]}" "$KRAB" fl-server fed.yaml --port-file port --report report.json \
  --set monitor.port="$MPORT" > server.log 2>&1 &
server=$!
pids+=("$server")
for _ in $(seq 1 300); do [[ -s port ]] && break; sleep 0.1; done
[[ -s port ]] || fail "server did not listen"
ADDR=127.0.0.1:$(cat port)

# ---- refused clients: the server keeps serving ----
set +e
"$KRAB" fl-client --server "$ADDR" --ca ca.pem --token not-a-token-at-all-000 --data clientdata > bad.log 2>&1
code=$?
[[ $code == 2 ]] || fail "unknown token: exit $code, want 2"
grep -q "token refused: unknown token" bad.log || fail "unknown token: message"
"$KRAB" fl-client --server "$ADDR" --ca ca.pem --token expired-token-0123456789 --data clientdata > expired.log 2>&1
code=$?
[[ $code == 2 ]] || fail "expired token: exit $code, want 2"
grep -q "expired" expired.log || fail "expired token: message"
"$KRAB" fl-client --server "$ADDR" --ca rogue.pem --token "$(token 0)" --data clientdata --retry-s 1 > rogue.log 2>&1
code=$?
[[ $code == 1 ]] || fail "rogue CA: exit $code, want 1"
grep -q "TLS handshake failed" rogue.log || fail "rogue CA: message"
set -e

# ---- a client's token: a missing or empty file, or none at all, is exit 2 naming it ----
set +e
expect_client_refusal() {  # WHAT PATTERN ARGS...
  local what=$1 pattern=$2; shift 2
  env -u KRAB_FL_TOKEN "$KRAB" fl-client --server "$ADDR" --ca ca.pem --data clientdata "$@" \
    > tokenfile.log 2>&1
  local code=$?
  [[ $code == 2 ]] || fail "$what: exit $code, want 2"
  grep -q -- "$pattern" tokenfile.log || fail "$what: message lacks '$pattern': $(cat tokenfile.log)"
}
expect_client_refusal "missing token file" "--token-file $T/none.tok: no such file" \
  --token-file "$T/none.tok"
: > empty.tok
expect_client_refusal "empty token file" "--token-file empty.tok is empty" --token-file empty.tok
expect_client_refusal "no token" "KRAB_FL_TOKEN" --retry-s 1
set -e
grep -q "warning: --token puts the token on the command line" bad.log ||
  fail "--token gave no warning: $(cat bad.log)"

# ---- five clients, one killed while the rounds run: client 1 reads its token from a file,
# client 2 from the environment, the others from --token ----
(umask 077; token 1 > client1.tok)
start_client() {
  local how=(--token "$(token $1)")
  [[ $1 == 1 ]] && how=(--token-file client1.tok)
  [[ $1 == 2 ]] && how=()
  KRAB_FL_TOKEN=$(token 2) "$KRAB" fl-client --server "$ADDR" --ca ca.pem "${how[@]}" \
    --data "$T/clientdata" --partition "$1/5" > "client$1.log" 2>&1 &
  pids+=("$!")
  eval "client$1=$!"
}
start_client 0
for _ in $(seq 1 600); do grep -q "joined" client0.log 2>/dev/null && break; sleep 0.05; done
grep -q "client 'client-0' joined" server.log || fail "the server did not say who joined"

# ---- while the server waits for the others: a second holder of client 0's token is refused
# (exit 2), and client 0 stays in ----
set +e
"$KRAB" fl-client --server "$ADDR" --ca ca.pem --token "$(token 0)" --data "$T/clientdata" \
  --partition 0/5 --retry-s 2 > copy.log 2>&1
code=$?
set -e
[[ $code == 2 ]] || fail "a second holder of a token: exit $code, want 2"
grep -q "is in use by a connected client" copy.log || fail "second holder: message"
grep -q "refused a call: a second client with the token of 'client-0'" server.log ||
  fail "the server did not say whom it refused"

for i in 1 2 3 4; do start_client "$i"; done
for _ in $(seq 1 3000); do grep -q "round 1:" client4.log 2>/dev/null && break; sleep 0.02; done
grep -q "round 1:" client4.log || fail "client 4 never trained"
kill -9 "$client4"

# plain mode: the server crashes after round 2 and is restarted with checkpoint.resume; the four
# live clients find it again and the run finishes all 5 rounds.
if [[ $MODE == plain ]]; then
  for _ in $(seq 1 900); do grep -q " 2/5 " server.log 2>/dev/null && break; sleep 0.02; done
  grep -q " 2/5 " server.log || fail "round 2 never finished"
  # Two rounds done: /metrics counts them, names the clients by state, shows no path.
  python3 - "$MPORT" "$T" <<'PY' || fail "the server's /metrics"
import re, sys, urllib.request
port, T = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
rounds = float(re.search(r"^krab_fl_rounds_total\S* (\S+)$", text, re.M).group(1))
assert rounds >= 2, text
assert re.search(r'^krab_fl_clients\{[^}]*state="', text, re.M), text
assert re.search(r"^krab_fl_bytes_total\{", text, re.M), text
assert T not in text and "/usr/share" not in text, "a path in /metrics"
print(f"fl-server /metrics: {rounds:g} rounds counted")
PY
  pkill -9 -f -- "fl-server fed.yaml" || true
  wait "$server" 2>/dev/null || true
  "$KRAB" fl-server fed.yaml --report report.json --set checkpoint.resume=true \
    --set federated.address="$ADDR" --set federated.clients=4 > server2.log 2>&1 &
  server=$!
  pids+=("$server")
fi
wait "$server" || fail "server exited $?"
if [[ $MODE == plain ]]; then
  grep -q "resumed .*fl-state.krab after round [2-4]" server2.log || fail "server did not resume"
fi
for i in 0 1 2 3; do wait "$(eval echo \$client$i)" || fail "client $i exited $?"; done
for i in 1 2; do
  if grep -q "warning" "client$i.log"; then fail "client $i warned: $(grep warning client$i.log)"; fi
done

python3 - "$T" "$MODE" <<'PY' || fail "report checks"
import json, re, sys
T, mode = sys.argv[1], sys.argv[2]
r = json.load(open(f"{T}/report.json"))
rounds = r["rounds"]
assert len(rounds) == 5 and all(x["ok"] for x in rounds), [x.get("failure") for x in rounds]
dropped = [d for x in rounds for d in x["dropped"] if d["client"] == "client-4"]
assert dropped, "client-4 was never reported dropped"
last = rounds[-1]
assert "client-4" not in last["counted"], last["counted"]
assert len(last["counted"]) >= 3, last["counted"]
assert r["test_accuracy"] > 0.6, r["test_accuracy"]
# The report is the last server's: after a restart it saw only the rounds after the resume.
first = 0
if mode == "plain":
    first = int(re.search(r"after round (\d+)", open(f"{T}/server2.log").read()).group(1))
else:
    assert r["refused_calls"] >= 2, r["refusals"]
seen = rounds[first:]
# What came in over the wire: updates (or masked vectors) of the model's size, not data.
counted = sum(len(x["counted"]) for x in seen)
fits = sum(len(x["cohort"]) for x in seen)
per_update = 4 * r["parameters"]
lo, hi = counted * per_update, fits * (per_update * (1.05 if r["secure_aggregation"] else 1.0) + 200000)
assert lo <= r["wire_bytes_in"] <= hi, (lo, r["wire_bytes_in"], hi)
print("report ok:", r["test_accuracy"], r["wire_bytes_in"], "bytes in over", len(seen), "rounds")
PY

if [[ -f strace.out ]]; then
  grep -q "serverdata/t10k" strace.out || fail "strace saw no open of the server's own data"
  if grep "clientdata" strace.out; then fail "the server opened a client's data"; fi
  echo "strace: the server opened serverdata/t10k-* and nothing under clientdata/"
fi
echo "PASS ($MODE)"
