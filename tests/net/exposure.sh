#!/usr/bin/env bash
# Issue 17, items 2 and 3: what of a krab job another host can reach. Two network namespaces,
# A and B, joined by a veth pair; the job runs in A (or across A and B), the "other host" is B.
#
#   exposure.sh KRAB PS_PROBE one_node|two_nodes
#
# one_node:  a one-node job (sync, then async with two parameter servers) in A. Every socket
#            listening in A while it runs (A is fresh: they are all the job's) must be on
#            loopback (`ss -ltn`), and from B nothing at A's address may accept a connection.
#            Before the fix the rendezvous TCPStore ([::]) and the servers (0.0.0.0) did.
# two_nodes: node 0 in A (two parameter servers, one worker), node 1 in B, sharing a job
#            secret. An outsider in B without it pulls, pushes a NaN gradient and calls Finish
#            on every port of A (ps_probe): all refused, the job completes with finite
#            parameters. It also asks the rendezvous store for krab/ps/0 (the key it once
#            overwrote) as a TCPStore client (ps_probe --store-has): not there.
#
# Same hygiene as two_hosts.sh: its own namespaces, veth pair and private /24, traffic only to
# addresses it assigned, everything removed by an EXIT trap. Exit 0 pass, 1 fail, 77 skipped.
set -u

KRAB=${1:?usage: exposure.sh KRAB PS_PROBE one_node|two_nodes}
PROBE=${2:?usage: exposure.sh KRAB PS_PROBE one_node|two_nodes}
MODE=${3:?usage: exposure.sh KRAB PS_PROBE one_node|two_nodes}
case "$MODE" in one_node|two_nodes) ;; *) echo "unknown mode '$MODE'"; exit 1 ;; esac

DEADLINE=$(( $(date +%s) + 100 ))  # CTest's TIMEOUT is 120 s
left() { local l=$(( DEADLINE - $(date +%s) )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
log()  { echo "[$(date +%T)] $*"; }

KRAB=$(readlink -f "$KRAB"); PROBE=$(readlink -f "$PROBE")
[ -x "$KRAB" ] || fail "krab binary '$KRAB' not found"
[ -x "$PROBE" ] || fail "ps_probe binary '$PROBE' not found (build the 'ps_probe' target)"
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "the 'ip' command (iproute2) is not installed"
command -v ss >/dev/null || skip "the 'ss' command (iproute2) is not installed"

ID=$$
NS_A="krab-exp-$ID-A"
NS_B="krab-exp-$ID-B"
VETH_A="kea$ID"
VETH_B="keb$ID"
SUBNET=$(( 10 + ID % 240 ))
ADDR_A="10.214.$SUBNET.1"
ADDR_B="10.214.$SUBNET.2"
PORT=29512
WORK=$(mktemp -d "${TMPDIR:-/tmp}/krab-exp-$MODE-$ID-XXXX")
PIDS=()

cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for ns in "$NS_A" "$NS_B"; do
    if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$ns"; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns delete "$ns" 2>/dev/null
    fi
  done
  ip link delete "$VETH_A" 2>/dev/null
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^krab-exp-[0-9]+-[AB]$'); do
  pid=${ns#krab-exp-}; pid=${pid%-*}
  if ! kill -0 "$pid" 2>/dev/null; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null && echo "removed stale namespace $ns"
  fi
done

if ! err=$(ip netns add "$NS_A" 2>&1); then
  skip "cannot create a network namespace ('ip netns add' said: $err); needs CAP_SYS_ADMIN"
fi
ip netns add "$NS_B" || fail "ip netns add $NS_B"
ip link add "$VETH_A" type veth peer name "$VETH_B" || fail "cannot create veth pair"
ip link set "$VETH_A" netns "$NS_A" || fail "move $VETH_A"
ip link set "$VETH_B" netns "$NS_B" || fail "move $VETH_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A" || fail "address A"
ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B" || fail "address B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
ip -n "$NS_A" link set "$VETH_A" up || fail "link A up"
ip -n "$NS_B" link set "$VETH_B" up || fail "link B up"
for i in $(seq 50); do
  ip -n "$NS_A" link show "$VETH_A" | grep -q LOWER_UP && ip -n "$NS_B" link show "$VETH_B" | grep -q LOWER_UP && break
  sleep 0.1
done
ip -n "$NS_A" link show "$VETH_A" | grep -q LOWER_UP || fail "veth $VETH_A did not come up"
log "namespaces $NS_A ($ADDR_A) and $NS_B ($ADDR_B) up, mode $MODE"

# Slow enough (rank 0 sleeps 40 ms a step; async runs with max_staleness 0, in its pace) that
# the probes run while the job does.
cat >"$WORK/job.yaml" <<EOF
name: exp
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 2048, batch_size: 32}
train: {steps: 60, slow_rank: 0, slow_delay_ms: 40, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 2}
comm: {timeout_s: 20}
EOF

listening() { ip netns exec "$NS_A" ss -ltnH | awk '{print $4}'; }
port_of() { echo "${1##*:}"; }
on_loopback() { case "$1" in 127.*|\[::1\]:*|\[::ffff:127.*) return 0 ;; *) return 1 ;; esac; }
# Whether a TCP connection from B to A's address on port $1 is accepted.
reachable_from_b() {
  timeout 3 ip netns exec "$NS_B" bash -c "exec 3<>/dev/tcp/$ADDR_A/$1" 2>/dev/null
}

# Runs the one-node job with extra flags "$@" in A; snapshots A's listening sockets until it
# ends, probing from B once $WANT sockets listen.
one_node_run() {
  local want=$1; shift
  local tag=$1; shift
  (cd "$WORK" && exec timeout -k 5 "$(left 40)" ip netns exec "$NS_A" "$KRAB" train job.yaml \
     --set checkpoint.dir="$tag" "$@") >"$WORK/$tag.log" 2>&1 &
  local pid=$!; PIDS+=("$pid")
  local probed=0 seen
  : >"$WORK/$tag.ss"
  while kill -0 "$pid" 2>/dev/null; do
    listening >>"$WORK/$tag.ss"
    seen=$(listening | wc -l)
    if [ "$probed" -eq 0 ] && [ "$seen" -ge "$want" ]; then
      probed=1
      local targets=()
      for a in $(listening); do
        p=$(port_of "$a")
        reachable_from_b "$p" && fail "$tag: port $p of the job ($a) accepts connections from $NS_B"
        targets+=("$ADDR_A:$p")
      done
      ip netns exec "$NS_B" env -u KRAB_JOB_SECRET "$PROBE" "${targets[@]}" >"$WORK/$tag.probe" 2>&1 \
        || { cat "$WORK/$tag.probe"; fail "$tag: a parameter-server call from $NS_B was answered"; }
      log "$tag: probed ${#targets[@]} port(s) from $NS_B: none reachable"
    fi
    sleep 0.1
  done
  wait "$pid"; local rc=$?
  PIDS=()
  tail -n 5 "$WORK/$tag.log"
  [ "$rc" -eq 0 ] || fail "$tag: the job exited $rc"
  [ "$probed" -eq 1 ] || fail "$tag: never saw $want listening socket(s) in $NS_A (ss said: $(sort -u "$WORK/$tag.ss" | tr '\n' ' '))"
  for a in $(sort -u "$WORK/$tag.ss"); do
    on_loopback "$a" || fail "$tag: the one-node job listened on $a, beyond loopback"
  done
  log "$tag: every listening socket was on loopback: $(sort -u "$WORK/$tag.ss" | tr '\n' ' ')"
}

if [ "$MODE" = one_node ]; then
  one_node_run 0 sync  # Gloo closes its listeners once its pairs connect
  one_node_run 2 async --set sync.mode=async --set sync.servers=2 --set sync.max_staleness=0
  log "PASS"
  exit 0
fi

# --- two nodes ------------------------------------------------------------------------------
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
COMMON=(train ../job.yaml --nnodes 2 --nproc-per-node 1 --rdzv "$ADDR_A:$PORT"
        --set sync.mode=async --set sync.servers=2 --set sync.max_staleness=0)
mkdir -p "$WORK/A" "$WORK/B"
(cd "$WORK/A" && exec timeout -k 5 "$(left 60)" ip netns exec "$NS_A" env KRAB_JOB_SECRET="$SECRET" \
   "$KRAB" "${COMMON[@]}" --node-rank 0 --set comm.iface="$VETH_A" --report report.json) \
   >"$WORK/A.log" 2>&1 &
PID_A=$!; PIDS+=("$PID_A")
(cd "$WORK/B" && exec timeout -k 5 "$(left 60)" ip netns exec "$NS_B" env KRAB_JOB_SECRET="$SECRET" \
   "$KRAB" "${COMMON[@]}" --node-rank 1 --set comm.iface="$ADDR_B") >"$WORK/B.log" 2>&1 &
PID_B=$!; PIDS+=("$PID_B")

# The store and both servers listening in A: probe them all from B, without the secret.
probed=0
while kill -0 "$PID_A" 2>/dev/null && [ "$probed" -eq 0 ]; do
  if [ "$(listening | wc -l)" -ge 3 ]; then
    probed=1
    targets=()
    for a in $(listening); do on_loopback "$a" || targets+=("$ADDR_A:$(port_of "$a")"); done
    ip netns exec "$NS_B" env -u KRAB_JOB_SECRET "$PROBE" "${targets[@]}" >"$WORK/probe.log" 2>&1
    RC_PROBE=$?
    cat "$WORK/probe.log"
    [ "$RC_PROBE" -eq 0 ] || fail "a call without the job secret was answered"
    grep -qx "secret-refusals 2" "$WORK/probe.log" || fail "the probe did not reach both parameter servers"
    found=$(ip netns exec "$NS_B" timeout 20 "$PROBE" --store-has "$ADDR_A:$PORT" krab/ps/0 2>/dev/null)
    log "krab/ps/0 through the store from $NS_B without the secret: $found"
    [ "$found" = absent ] || fail "an outsider could see krab/ps/0 in the rendezvous store ($found)"
  fi
  sleep 0.1
done
wait "$PID_A"; RC_A=$?
wait "$PID_B"; RC_B=$?
PIDS=()
for n in A B; do echo "----- node $n -----"; tail -n 12 "$WORK/$n.log"; done
[ "$probed" -eq 1 ] || fail "node 0 ended before its store and servers were seen listening"
[ "$RC_A" -eq 0 ] || fail "node 0 exited $RC_A"
[ "$RC_B" -eq 0 ] || fail "node 1 exited $RC_B"
grep -q "refused a Step call" "$WORK/A.log" || fail "the servers logged no refused call"
python3 - "$WORK/A/report.json" <<'EOF' || fail "the report's loss is not finite"
import json, math, sys
r = json.load(open(sys.argv[1]))
assert math.isfinite(r["final_loss"]) and r["async"]["workers_lost"] == 0, r["async"]
EOF
log "PASS"
