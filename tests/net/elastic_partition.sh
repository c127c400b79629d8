#!/usr/bin/env bash
# Issue 27, item 4 (docs/design/elastic.md §6.4, §12 "4 partition"): a network partition of one
# machine of an elastic run. Three "machines" A, B, C (network namespaces, one krab node each,
# one worker each) on a bridge that lives in a fourth namespace; node 0 in A keeps the
# membership (the c10d rendezvous). Once node 0's progress file says ~10 steps are done, C's
# link is set down for 10 s (no RST: its TCP connections just stall), then up again.
#
#   elastic_partition.sh KRAB PYTHON
#
# What must hold, from node 0's --report (`membership`) and the launchers:
#   (a) a change drops C's member 2.0.0 for silence ("no heartbeat") within
#       elastic.dead_after_ms + 1.5 s of the cut (its decided_at against the time of the cut);
#   (b) training goes on at 2 workers during the cut (progress before `up` > at the cut);
#   (c) after `up`, a later change has C's next incarnation 2.0.1 join, and the run ends with
#       3 workers and every step done;
#   (d) all three launchers exit 0 and no process is left in any namespace;
#   (e) the final model equals an uninterrupted 3-worker run of the same job on the plain host
#       within 1e-4 relative (the global batch is fixed, so only the float order differs).
#
# The test creates and deletes its own namespaces, bridge, veth pairs and private /24
# (10.214.X.0/24, X derived from the PID); it sends traffic only to addresses it assigned inside
# those namespaces. Everything is removed by an EXIT trap, also on failure or timeout.
# Exit codes: 0 pass, 1 fail, 77 skipped (no permission to create network namespaces).
set -u

KRAB=${1:?usage: elastic_partition.sh KRAB PYTHON}
PY=${2:?usage: elastic_partition.sh KRAB PYTHON}

# CTest kills a test that passes its TIMEOUT (240 s) with SIGKILL, which no trap survives:
# every command below is bounded by what is left of a 200 s budget instead.
DEADLINE=$(( $(date +%s) + 200 ))
left() { local l=$(( DEADLINE - $(date +%s) )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
log()  { echo "[$(date +%T)] $*"; }
now()  { date +%s.%N; }

KRAB=$(readlink -f "$KRAB")
[ -x "$KRAB" ] || fail "krab binary '$KRAB' not found (build the 'krab' target first)"
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "the 'ip' command (iproute2) is not installed"

# Unique names (interface names are limited to 15 characters).
ID=$$
HOSTS="A B C"
ns_of() { echo "krab-part-$ID-$1"; }
NS_BR=$(ns_of BR)
BRIDGE="kpbr$ID"
host_end() { echo "kp$(echo "$1" | tr ABC abc)$ID"; }    # the machine's interface
bridge_end() { echo "kq$(echo "$1" | tr ABC abc)$ID"; }  # its peer, on the bridge
SUBNET=$(( 10 + ID % 240 ))
addr_of() { case "$1" in A) echo "10.214.$SUBNET.1" ;; B) echo "10.214.$SUBNET.2" ;; C) echo "10.214.$SUBNET.3" ;; esac; }
PORT=29531
WORK=$(mktemp -d "${TMPDIR:-/tmp}/krab-part-$ID-XXXX")
PIDS=()

all_ns() { for h in $HOSTS BR; do ns_of "$h"; done; }

cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # Deleting a namespace does not kill processes inside it: kill any left (ours only).
  for ns in $(all_ns); do
    if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$ns"; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns delete "$ns" 2>/dev/null
    fi
  done
  for h in $HOSTS; do ip link delete "$(host_end "$h")" 2>/dev/null; done  # if still in the root
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Namespaces a killed earlier run of this test left behind (its PID is gone): remove them.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^krab-part-[0-9]+-(A|B|C|BR)$'); do
  pid=${ns#krab-part-}; pid=${pid%-*}
  if ! kill -0 "$pid" 2>/dev/null; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null && echo "removed stale namespace $ns"
  fi
done

# --- three machines on a bridge ------------------------------------------------------------
if ! err=$(ip netns add "$NS_BR" 2>&1); then
  skip "cannot create a network namespace ('ip netns add' said: $err); needs CAP_SYS_ADMIN"
fi
ip -n "$NS_BR" link add "$BRIDGE" type bridge || fail "cannot create the bridge"
ip -n "$NS_BR" link set "$BRIDGE" up || fail "bridge up"
for h in $HOSTS; do
  ns=$(ns_of "$h"); me=$(host_end "$h"); peer=$(bridge_end "$h")
  ip netns add "$ns" || fail "ip netns add $ns"
  ip link add "$me" type veth peer name "$peer" || fail "cannot create veth pair for $h"
  ip link set "$me" netns "$ns" || fail "move $me"
  ip link set "$peer" netns "$NS_BR" || fail "move $peer"
  ip -n "$NS_BR" link set "$peer" master "$BRIDGE" || fail "attach $peer to the bridge"
  ip -n "$NS_BR" link set "$peer" up || fail "$peer up"
  ip -n "$ns" addr add "$(addr_of "$h")/24" dev "$me" || fail "address of $h"
  ip -n "$ns" link set lo up || fail "lo up in $ns"
  ip -n "$ns" link set "$me" up || fail "link $h up"
done
link_up() { ip -n "$(ns_of "$1")" link show "$(host_end "$1")" | grep -q LOWER_UP; }
for i in $(seq 50); do
  link_up A && link_up B && link_up C && break
  sleep 0.1
done
for h in $HOSTS; do link_up "$h" || fail "the link of $h did not come up"; done
log "machines A, B, C ($(addr_of A), $(addr_of B), $(addr_of C)) on bridge $BRIDGE in $NS_BR"

# --- the job -------------------------------------------------------------------------------
# The MLP of tests/cli/elastic_e2e_test.cpp on 3 workers (the global batch, 36, splits over 3
# and 2), paced by a 100 ms straggler on rank 0 so that the run outlasts the cut and the rejoin
# (~10 steps before the cut, ~100 during it, the rest with C back). comm.timeout_s (8 s, below
# the cut's 10) fails C's stalled collective and its stalled store calls while the link is
# down, so C's worker and agent must live through store errors; it is also the start-up grace
# of generation 0's members. elastic.wait_s bounds how long C's worker waits for a record.
STEPS=400
DEAD_AFTER_MS=3000
cat >"$WORK/job.yaml" <<EOF
name: part
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 4096, batch_size: 12}
train: {steps: $STEPS, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}, slow_rank: 0, slow_delay_ms: 100}
parallel: {workers: 3}
comm: {timeout_s: 8}
elastic: {enabled: true, heartbeat_ms: 200, dead_after_ms: $DEAD_AFTER_MS, wait_s: 60}
EOF
KRAB_JOB_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export KRAB_JOB_SECRET
RDZV="$(addr_of A):$PORT"
for h in $HOSTS; do mkdir -p "$WORK/$h"; done
mkdir -p "$WORK/host"

start_node() {  # start_node HOST RANK [extra args...]
  local h=$1 rank=$2; shift 2
  (cd "$WORK/$h" && exec timeout -k 5 "$(left 150)" ip netns exec "$(ns_of "$h")" "$KRAB" train \
     ../job.yaml --nnodes 3 --node-rank "$rank" --nproc-per-node 1 --rdzv "$RDZV" "$@") \
    >"$WORK/$h.log" 2>&1 &
}
log "node 0 in A, node 1 in B, node 2 in C; $STEPS steps"
start_node A 0 --report report.json --progress-file "$WORK/progress"; PID_A=$!; PIDS+=("$PID_A")
start_node B 1; PID_B=$!; PIDS+=("$PID_B")
start_node C 2; PID_C=$!; PIDS+=("$PID_C")

progress() { local p; p=$(cat "$WORK/progress" 2>/dev/null); echo "${p:--1}"; }
running() { kill -0 "$PID_A" 2>/dev/null && kill -0 "$PID_B" 2>/dev/null && kill -0 "$PID_C" 2>/dev/null; }
show_logs() { for h in $HOSTS; do echo "----- node in $h -----"; tail -n 40 "$WORK/$h.log"; done; }

# --- the cut -------------------------------------------------------------------------------
START_BY=$(( $(date +%s) + 90 ))  # start-up (LibTorch, data, the group) takes a few seconds
until [ "$(progress)" -ge 10 ]; do
  running || { show_logs; fail "a launcher ended before step 10"; }
  [ "$(date +%s)" -lt "$START_BY" ] || { show_logs; fail "step 10 was not reached in 90 s"; }
  sleep 0.05
done
C_NS=$(ns_of C); C_END=$(host_end C)
T_CUT=$(now)
ip -n "$C_NS" link set "$C_END" down || fail "cannot set $C_END down"
STEP_CUT=$(progress)
log "cut: $C_END down at step $STEP_CUT"
sleep 10
STEP_BEFORE_UP=$(progress)
ip -n "$C_NS" link set "$C_END" up || fail "cannot set $C_END up"
T_UP=$(now)
log "up: $C_END up again at step $STEP_BEFORE_UP"

wait "$PID_A"; RC_A=$?
wait "$PID_B"; RC_B=$?
wait "$PID_C"; RC_C=$?
PIDS=()
T_END=$(now)
log "node 0 exited $RC_A, node 1 $RC_B, node 2 $RC_C"
show_logs
echo "--------------------------"
[ "$RC_A" -eq 0 ] || fail "node 0 exited $RC_A (124/137 = timed out)"
[ "$RC_B" -eq 0 ] || fail "node 1 exited $RC_B (124/137 = timed out)"
[ "$RC_C" -eq 0 ] || fail "node 2 exited $RC_C (124/137 = timed out)"
for ns in $(all_ns); do
  left_over=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  [ -z "$left_over" ] || fail "processes left in $ns after the launchers exited: $left_over"
done
[ -f "$WORK/A/runs/part/model.pt" ] || fail "node 0 wrote no runs/part/model.pt"
[ "$STEP_BEFORE_UP" -gt "$STEP_CUT" ] ||
  fail "(b) no step completed during the cut (step $STEP_CUT at the cut, $STEP_BEFORE_UP before up)"

log "the same job on the plain host, parallel.workers=3, uninterrupted"
(cd "$WORK/host" && env -u KRAB_JOB_SECRET timeout -k 5 "$(left 60)" "$KRAB" train ../job.yaml \
   --set parallel.workers=3 --set train.slow_delay_ms=0) >"$WORK/host.log" 2>&1 \
  || { tail -n 30 "$WORK/host.log"; fail "the uninterrupted run failed"; }

timeout "$(left 60)" "$PY" - "$WORK/A/report.json" "$WORK/A/runs/part/model.pt" \
  "$WORK/host/runs/part/model.pt" "$T_CUT" "$T_UP" "$DEAD_AFTER_MS" "$STEPS" <<'EOF' \
  || fail "see above"
import json, sys, torch
report = json.load(open(sys.argv[1]))
cut_model, whole_model = torch.load(sys.argv[2]), torch.load(sys.argv[3])
t_cut, t_up = float(sys.argv[4]), float(sys.argv[5])
dead_after_s, steps = int(sys.argv[6]) / 1000.0, int(sys.argv[7])
changes = report.get("membership", [])
for c in changes:
    print(f"change: generation {c['generation']} {c['reason']}, {c['workers']} workers from "
          f"step {c['step']}, lost '{c['lost']}', joined '{c['joined']}', decided "
          f"{c['decided_at'] - t_cut:+.3f} s after the cut")
ok = True
def check(cond, what):
    global ok
    print(("ok:   " if cond else "FAIL: ") + what)
    ok = ok and cond
drops = [c for c in changes if "2.0.0" in c["lost"] and "no heartbeat" in c["lost"]]
check(len(drops) == 1, "(a) one change drops C's member 2.0.0 for silence")
if drops:
    detect = drops[0]["decided_at"] - t_cut
    print(f"detection: decided {detect:.3f} s after the cut "
          f"(limit elastic.dead_after_ms + 1.5 s = {dead_after_s + 1.5:.1f} s)")
    check(0 < detect <= dead_after_s + 1.5, "(a) C dropped within dead_after_ms + 1.5 s")
    check(drops[0]["workers"] == 2, "(a) 2 workers go on")
joins = [c for c in changes if "2.0.1" in c["joined"]]
check(len(joins) == 1 and joins[0]["decided_at"] > t_up,
      "(c) C's next incarnation 2.0.1 joins after the link returned")
if drops and joins:
    check(joins[0]["generation"] > drops[0]["generation"], "(c) the join comes after the drop")
check(bool(changes) and changes[-1]["workers"] == 3, "(c) the run ends with 3 workers")
check(report.get("steps") == steps, f"(c) every step done ({report.get('steps')} of {steps})")
def rel(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(((a[k] - b[k]).norm() / a[k].norm().clamp_min(1e-12)).item() for k in a)
diff = rel(whole_model, cut_model)
print(f"parameters: {len(cut_model)} tensors; partitioned vs uninterrupted run: max relative "
      f"difference {diff:.3g} (limit 1e-4)")
check(diff <= 1e-4, "(e) the model equals the uninterrupted run's")
sys.exit(0 if ok else 1)
EOF
log "PASS ($(awk -v a="$T_CUT" -v b="$T_END" 'BEGIN{printf "%.1f", b-a}') s from the cut to the end)"
