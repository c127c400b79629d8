#!/usr/bin/env bash
# Issue 27, item 5 (docs/design/elastic.md §12, "etcd, lose the starter"): an elastic job whose
# records live in etcd loses the machine that started it. Three namespace "machines" A, B, C on
# a bridge that lives in a fourth namespace S; each runs one member of a 3-member etcd cluster
# and one krab node with one worker (`--rdzv-backend etcd`, --rdzv-endpoints naming all three
# members). Node 0 in A hosts the first store and leads the membership. Once node 0 has done
# ~10 steps, every process in A's namespace is SIGKILLed (its etcd member too: B's and C's keep
# the quorum) and A's link is set down.
#
#   elastic_etcd.sh KRAB PYTHON
#
# It must end with: B's and C's launchers exit 0; one of them says it "leads the membership";
# the final report (written where the last generation's rank 0 ran, on B or C) has every step
# and a membership entry that lost member 0.0.0 and went on with 2 workers; its model.pt equals
# an uninterrupted 3-worker run of the same job on the plain host (loopback) within 1e-4
# relative; no krab or etcd process is left in any namespace. It prints the time from the kill
# to the takeover line and to the new generation's decided_at.
#
# A's processes die as its link goes down, so their FINs and RSTs may never reach B and C: the
# op of generation 0's group the survivors had pending with A then ends only at comm.timeout_s.
# Their exits must not wait for it (comm/reaper.h); when they did, each finished worker fell
# silent at exit, the new leader counted it dead and its machine started it again, and B and C
# both wrote a model and a report (caught below) or one launcher exited 1.
#
# Hygiene as in two_hosts.sh: its own namespaces, veth pairs, bridge and private /24 (10.215.X.0/24,
# X from the PID); traffic only to addresses it assigned; everything removed by an EXIT trap.
# Exit codes: 0 pass, 1 fail, 77 skipped (not root, no `ip`, no `etcd` or `curl`).
set -u

KRAB=${1:?usage: elastic_etcd.sh KRAB PYTHON}
PY=${2:?usage: elastic_etcd.sh KRAB PYTHON}

# CTest's TIMEOUT is 180 s and its SIGKILL passes no trap: every command is bounded by what is
# left of a 150 s budget. A pass takes ~20 s on a loaded 2-core machine.
START=$(date +%s)
DEADLINE=$(( START + 150 ))
left() { local l=$(( DEADLINE - $(date +%s) )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
log()  { echo "[$(date +%T.%3N)] $*"; }

KRAB=$(readlink -f "$KRAB")
[ -x "$KRAB" ] || fail "krab binary '$KRAB' not found (build the 'krab' target first)"
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "the 'ip' command (iproute2) is not installed"
command -v etcd >/dev/null || skip "no etcd binary (scripts/setup.sh installs etcd-server)"
command -v curl >/dev/null || skip "no curl (used to ask the etcd members for their health)"

ID=$$
HOSTS=(A B C)
NS_S="krab-etcd-$ID-S"
ns_of() { echo "krab-etcd-$ID-$1"; }
host_if() { echo "kh${1,,}$ID"; }    # the host's end of its veth pair (15 characters at most)
switch_if() { echo "ks${1,,}$ID"; }  # the bridge's end
SUBNET=$(( 10 + ID % 240 ))
declare -A ADDR=([A]="10.215.$SUBNET.1" [B]="10.215.$SUBNET.2" [C]="10.215.$SUBNET.3")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/krab-net-etcd-$ID-XXXX")
PIDS=()
declare -A ETCD_PID

cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # Deleting a namespace does not kill processes inside it: kill any left (ours only).
  for ns in "$(ns_of A)" "$(ns_of B)" "$(ns_of C)" "$NS_S"; do
    if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$ns"; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns delete "$ns" 2>/dev/null
    fi
  done
  for h in "${HOSTS[@]}"; do ip link delete "$(host_if "$h")" 2>/dev/null; done  # never moved
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Namespaces a killed earlier run of this test left behind (its PID is gone): remove them.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^krab-etcd-[0-9]+-[ABCS]$'); do
  pid=${ns#krab-etcd-}; pid=${pid%-*}
  if ! kill -0 "$pid" 2>/dev/null; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null && echo "removed stale namespace $ns"
  fi
done

# --- the three hosts and the switch ---------------------------------------------------------
if ! err=$(ip netns add "$NS_S" 2>&1); then
  skip "cannot create a network namespace ('ip netns add' said: $err); needs CAP_SYS_ADMIN"
fi
ip -n "$NS_S" link add br0 type bridge || fail "cannot create a bridge"
ip -n "$NS_S" link set br0 up || fail "bridge up"
for h in "${HOSTS[@]}"; do
  ns=$(ns_of "$h"); hi=$(host_if "$h"); si=$(switch_if "$h")
  ip netns add "$ns" || fail "ip netns add $ns"
  ip link add "$hi" type veth peer name "$si" || fail "cannot create veth pair $hi/$si"
  ip link set "$hi" netns "$ns" || fail "move $hi"
  ip link set "$si" netns "$NS_S" || fail "move $si"
  ip -n "$NS_S" link set "$si" master br0 || fail "attach $si to the bridge"
  ip -n "$NS_S" link set "$si" up || fail "$si up"
  ip -n "$ns" addr add "${ADDR[$h]}/24" dev "$hi" || fail "address of $h"
  ip -n "$ns" link set lo up || fail "lo up in $ns"
  ip -n "$ns" link set "$hi" up || fail "$hi up"
done
for _ in $(seq 50); do  # every host's end up
  up=0
  for h in "${HOSTS[@]}"; do
    ip -n "$(ns_of "$h")" link show "$(host_if "$h")" | grep -q LOWER_UP && up=$((up + 1))
  done
  [ "$up" -eq 3 ] && break
  sleep 0.1
done
[ "$up" -eq 3 ] || fail "the veth links did not come up"
log "hosts A ${ADDR[A]}, B ${ADDR[B]}, C ${ADDR[C]} on a bridge in $NS_S"

# --- one etcd member per host ----------------------------------------------------------------
# Fixed ports are safe: each member has its namespace's address to itself.
CLUSTER=""; ENDPOINTS=""
for h in "${HOSTS[@]}"; do
  CLUSTER+="${CLUSTER:+,}m$h=http://${ADDR[$h]}:2380"
  ENDPOINTS+="${ENDPOINTS:+,}${ADDR[$h]}:2379"
done
for h in "${HOSTS[@]}"; do
  a=${ADDR[$h]}
  ip netns exec "$(ns_of "$h")" etcd --name "m$h" --data-dir "$WORK/etcd-$h" \
    --listen-client-urls "http://$a:2379" --advertise-client-urls "http://$a:2379" \
    --listen-peer-urls "http://$a:2380" --initial-advertise-peer-urls "http://$a:2380" \
    --initial-cluster "$CLUSTER" --initial-cluster-state new \
    --initial-cluster-token "krab-net-etcd-$ID" >"$WORK/etcd-$h.log" 2>&1 &
  ETCD_PID[$h]=$!; PIDS+=($!)
done
healthy() {
  [[ $(ip netns exec "$(ns_of "$1")" curl -s -m 1 "http://${ADDR[$1]}:2379/health") \
       == *'"health":"true"'* ]]
}
etcd_deadline=$(( $(date +%s) + $(left 30) ))
for h in "${HOSTS[@]}"; do
  until healthy "$h"; do
    kill -0 "${ETCD_PID[$h]}" 2>/dev/null || { tail -n 5 "$WORK/etcd-$h.log"; fail "etcd m$h exited"; }
    [ "$(date +%s)" -lt "$etcd_deadline" ] || { tail -n 5 "$WORK"/etcd-*.log; fail "etcd not healthy"; }
    sleep 0.1
  done
done
log "etcd cluster of 3 healthy: $ENDPOINTS"
# Whether A's member is etcd's raft leader changes what the takeover costs (a new raft leader
# first; a request a follower forwards to the dead one waits out the client's 3 s attempt).
if command -v etcdctl >/dev/null; then
  raft_leader=$(ETCDCTL_API=3 timeout 5 ip netns exec "$(ns_of B)" etcdctl --endpoints "$ENDPOINTS" \
    endpoint status -w table 2>/dev/null | awk -F'|' '$6 ~ /true/ {gsub(/ /, "", $2); print $2}')
  log "etcd's raft leader: ${raft_leader:-unknown}"
fi

# --- the job ---------------------------------------------------------------------------------
# Rank 0 sleeps 40 ms a step so that the kill lands mid-run and the survivors have steps left.
cat >"$WORK/job.yaml" <<EOF
name: etcdnet
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 12}
train: {steps: 60, slow_rank: 0, slow_delay_ms: 40, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 3}
comm: {timeout_s: 30}
elastic: {enabled: true}
EOF
export KRAB_JOB_SECRET="krab-net-etcd-test-secret-$ID"
declare -A NODE_PID
for r in 0 1 2; do
  h=${HOSTS[r]}; mkdir -p "$WORK/$h"
  (cd "$WORK/$h" && exec timeout -k 5 "$(left 120)" ip netns exec "$(ns_of "$h")" "$KRAB" train \
     ../job.yaml --nnodes 3 --node-rank "$r" --nproc-per-node 1 --rdzv-backend etcd \
     --rdzv-endpoints "$ENDPOINTS" --report report.json --progress-file "$WORK/$h/progress") \
    >"$WORK/$h.log" 2>&1 &
  NODE_PID[$h]=$!; PIDS+=($!)
done
log "nodes 0, 1, 2 started in A, B, C"

# Node 0's progress file holds its completed steps; kill A at step 10.
done_steps=0
until [ "$done_steps" -ge 10 ]; do
  done_steps=$(cat "$WORK/A/progress" 2>/dev/null); done_steps=${done_steps:-0}
  for h in "${HOSTS[@]}"; do
    kill -0 "${NODE_PID[$h]}" 2>/dev/null || { tail -n 20 "$WORK/$h.log"; fail "node in $h ended before the kill"; }
  done
  [ "$(date +%s)" -lt "$DEADLINE" ] || fail "node 0 did not reach step 10 (at $done_steps)"
  sleep 0.05
done
KILL_T=$(date +%s.%N)
ip netns pids "$(ns_of A)" | xargs -r kill -KILL
ip -n "$(ns_of A)" link set "$(host_if A)" down || fail "A's link down"
log "A killed at node 0's step $done_steps (every process in its namespace) and its link set down"

# Until B's and C's launchers end: when the takeover line appears.
TAKEOVER_T=""
while kill -0 "${NODE_PID[B]}" 2>/dev/null || kill -0 "${NODE_PID[C]}" 2>/dev/null; do
  if [ -z "$TAKEOVER_T" ] && grep -qs "leads the membership" "$WORK/B.log" "$WORK/C.log"; then
    TAKEOVER_T=$(date +%s.%N)
    log "takeover line seen $(awk -v t="$TAKEOVER_T" -v k="$KILL_T" 'BEGIN {printf "%.2f", t - k}') s after the kill"
  fi
  sleep 0.05
done
wait "${NODE_PID[B]}"; RC_B=$?
wait "${NODE_PID[C]}"; RC_C=$?
wait "${NODE_PID[A]}" 2>/dev/null
log "node 1 (B) exited $RC_B, node 2 (C) exited $RC_C"
for h in "${HOSTS[@]}"; do echo "----- node in $h -----"; grep -v '^train \[' "$WORK/$h.log" | tail -n 15; done
echo "----------------------"
[ "$RC_B" -eq 0 ] || fail "node 1 exited $RC_B (124/137 = timed out)"
[ "$RC_C" -eq 0 ] || fail "node 2 exited $RC_C (124/137 = timed out)"
grep -h "leads the membership" "$WORK/B.log" "$WORK/C.log" || fail "no node says it leads the membership"

# No process of the job may outlive its launcher; only B's and C's etcd members remain.
for ns in "$(ns_of A)" "$(ns_of B)" "$(ns_of C)" "$NS_S"; do
  for p in $(ip netns pids "$ns"); do
    [ "$p" = "${ETCD_PID[B]}" ] || [ "$p" = "${ETCD_PID[C]}" ] \
      || fail "process $p ($(cat "/proc/$p/cmdline" 2>/dev/null | tr '\0' ' ')) left in $ns"
  done
done
# The last members of a cluster may wait for a quorum that is going away (start_etcd.sh):
# SIGTERM, then SIGKILL after 1 s.
stop_etcd() {
  kill "-$1" "${ETCD_PID[B]}" "${ETCD_PID[C]}" 2>/dev/null
  for _ in $(seq 10); do
    kill -0 "${ETCD_PID[B]}" 2>/dev/null || kill -0 "${ETCD_PID[C]}" 2>/dev/null || return 0
    sleep 0.1
  done
}
stop_etcd TERM
stop_etcd KILL
wait "${ETCD_PID[B]}" "${ETCD_PID[C]}" 2>/dev/null
left_over=""
for ns in "$(ns_of A)" "$(ns_of B)" "$(ns_of C)" "$NS_S"; do left_over+=$(ip netns pids "$ns"); done
[ -z "$left_over" ] || fail "processes left in the namespaces after stopping etcd: $left_over"

# The final generation's rank 0 wrote the model and the report on B or C (not both).
FINAL=""
for h in B C; do
  if [ -f "$WORK/$h/runs/etcdnet/model.pt" ] && [ -f "$WORK/$h/report.json" ]; then
    [ -z "$FINAL" ] || fail "both B and C wrote a model and a report"
    FINAL=$h
  fi
done
[ -n "$FINAL" ] || fail "neither B nor C has runs/etcdnet/model.pt and report.json"
log "the final report and model are on $FINAL"

log "the same job uninterrupted on the plain host: 3 workers, not elastic, no pacing"
mkdir -p "$WORK/host"
(cd "$WORK/host" && timeout -k 5 "$(left 60)" "$KRAB" train ../job.yaml \
   --set elastic.enabled=false --set train.slow_delay_ms=0) >"$WORK/host.log" 2>&1 \
  || { tail -n 30 "$WORK/host.log"; fail "the uninterrupted run failed"; }

timeout "$(left 60)" "$PY" - "$WORK/$FINAL/runs/etcdnet/model.pt" "$WORK/host/runs/etcdnet/model.pt" \
  "$WORK/$FINAL/report.json" "$KILL_T" "${TAKEOVER_T:-nan}" <<'EOF' || fail "see above"
import json, math, sys, torch
survived, whole = torch.load(sys.argv[1]), torch.load(sys.argv[2])
report = json.load(open(sys.argv[3]))
kill_t, takeover_t = float(sys.argv[4]), float(sys.argv[5])
ok = True
def check(cond, what):
    global ok
    print(("ok:   " if cond else "FAIL: ") + what)
    ok = ok and bool(cond)
check(report["steps"] == 60, f"report steps {report['steps']} (60)")
lost = [m for m in report.get("membership", []) if "member 0.0.0" in m.get("lost", "")]
check(len(lost) == 1, f"one membership entry lost member 0.0.0: {report.get('membership')}")
if lost:
    m = lost[0]
    check(m["workers"] == 2 and m["previous_workers"] == 3,
          f"generation {m['generation']}: {m['previous_workers']} -> {m['workers']} workers "
          f"({m['reason']}; lost: {m['lost']}; lost_steps {m['lost_steps']})")
    takeover = "" if math.isnan(takeover_t) else f", takeover line {takeover_t - kill_t:.2f} s"
    print(f"kill -> decided_at {m['decided_at'] - kill_t:.2f} s{takeover}, "
          f"-> resumed_at {m['resumed_at'] - kill_t:.2f} s")
def rel(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(((a[k] - b[k]).norm() / a[k].norm().clamp_min(1e-12)).item() for k in a)
diff = rel(survived, whole)
check(diff <= 1e-4, f"final parameters vs the uninterrupted run: max relative difference "
      f"{diff:.3g} (limit 1e-4)")
sys.exit(0 if ok else 1)
EOF
log "PASS ($(( $(date +%s) - START )) s)"
