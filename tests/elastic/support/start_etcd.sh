#!/usr/bin/env bash
# A private etcd for one test: MEMBERS members (default 1) on free 127.0.0.1 ports, data in a
# fresh temp dir, stopped and removed when this script ends (EXIT trap; a watchdog also stops
# them if this script is SIGKILLed).
#
#   start_etcd.sh [-n MEMBERS] [-- COMMAND ARGS...]
#
# With COMMAND: runs it with these variables exported, and exits with its status:
#   KRAB_TEST_ETCD_ENDPOINTS  host:port of every member's client URL, comma-separated, in
#                             member order (what `--rdzv-endpoints` takes)
#   KRAB_TEST_ETCD_PIDS       the members' PIDs, space-separated, same order (a test may kill
#                             one to lose a member or the leader)
#   KRAB_TEST_ETCD_DIR        the temp dir (member logs: m<i>.log)
# Without COMMAND: prints those three lines as NAME=VALUE, then waits until it gets SIGTERM or
# SIGINT, and cleans up.
#
# It touches nothing but its temp dir and the processes it starts; it talks to its members
# only. Ready means every member answers GET /health with {"health":"true"} (bounded: 20 s).
# A 3.4 member starts in ~0.3 s, three in ~2.3 s (docs/design/elastic.md §15.6).
# Exit codes: COMMAND's status; 77 skipped (no etcd binary); 1 if etcd did not start.
set -u

MEMBERS=1
while (($#)); do
  case "$1" in
    -n) MEMBERS=${2:?-n needs a count}; shift 2 ;;
    --) shift; break ;;
    *) echo "start_etcd.sh: unknown argument '$1' (usage: start_etcd.sh [-n N] [-- CMD...])" >&2
       exit 2 ;;
  esac
done
[[ $MEMBERS =~ ^[1-9]$ ]] || { echo "start_etcd.sh: -n wants 1..9, got '$MEMBERS'" >&2; exit 2; }
command -v etcd >/dev/null || { echo "SKIPPED: no etcd binary (scripts/setup.sh installs etcd-server)"; exit 77; }
command -v curl >/dev/null || { echo "SKIPPED: no curl"; exit 77; }
command -v python3 >/dev/null || { echo "SKIPPED: no python3 (used to find free ports)"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/krab-etcd-XXXXXX")
PIDS=()
WATCHDOG=""

# One member stops in under 1 s on SIGTERM; the last members of a cluster may wait for a quorum
# that is going away, so after 1 s they are killed (their data is thrown away anyway).
stop_all() {
  stop_pids 10
  PIDS=()
}
# shellcheck source=tests/elastic/support/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"

# Ports: bound to port 0 by the kernel, then released; a port taken again in between makes a
# member fail to start, and the whole start is retried with new ports (3 tries).
free_ports() {
  python3 -c 'import socket,sys
ss=[socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}

healthy() { [[ $(curl -s -m 1 "http://127.0.0.1:$1/health") == *'"health":"true"'* ]]; }

start_members() {  # -> 0 when every member is healthy
  local ports cluster="" i
  read -r -a ports < <(free_ports $((2 * MEMBERS)))
  CLIENT=("${ports[@]:0:MEMBERS}")
  local peer=("${ports[@]:MEMBERS}")
  for ((i = 0; i < MEMBERS; i++)); do cluster+="${cluster:+,}m$i=http://127.0.0.1:${peer[i]}"; done
  for ((i = 0; i < MEMBERS; i++)); do
    rm -rf "$WORK/m$i"
    etcd --name "m$i" --data-dir "$WORK/m$i" \
      --listen-client-urls "http://127.0.0.1:${CLIENT[i]}" \
      --advertise-client-urls "http://127.0.0.1:${CLIENT[i]}" \
      --listen-peer-urls "http://127.0.0.1:${peer[i]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${peer[i]}" \
      --initial-cluster "$cluster" --initial-cluster-state new \
      --initial-cluster-token "krab-test-$$" >"$WORK/m$i.log" 2>&1 &
    PIDS+=($!)
    disown $!  # no "Killed" notice from bash when a member is killed at the end
  done
  local deadline=$((SECONDS + 20))
  for ((i = 0; i < MEMBERS; i++)); do
    until healthy "${CLIENT[i]}"; do
      local p
      for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
      ((SECONDS < deadline)) || return 1
      sleep 0.05
    done
  done
}

started=0
for _ in 1 2 3; do
  if start_members; then started=1; break; fi
  stop_all
done
if ((!started)); then
  echo "start_etcd.sh: etcd did not become healthy; last log lines:" >&2
  tail -n 5 "$WORK"/m*.log >&2
  exit 1
fi

# The watchdog outlives a SIGKILL of this script (which no trap sees) and then stops the
# members by their PIDs, which it was given at start.
(
  trap '' HUP
  while kill -0 $$ 2>/dev/null; do sleep 1; done
  kill -KILL "${PIDS[@]}" 2>/dev/null
  rm -rf "$WORK"
) >/dev/null 2>&1 &
WATCHDOG=$!

ENDPOINTS=""
for c in "${CLIENT[@]}"; do ENDPOINTS+="${ENDPOINTS:+,}127.0.0.1:$c"; done
export KRAB_TEST_ETCD_ENDPOINTS=$ENDPOINTS
export KRAB_TEST_ETCD_PIDS="${PIDS[*]}"
export KRAB_TEST_ETCD_DIR=$WORK

if (($#)); then
  "$@"
  exit $?
fi
echo "KRAB_TEST_ETCD_ENDPOINTS=$KRAB_TEST_ETCD_ENDPOINTS"
echo "KRAB_TEST_ETCD_PIDS=$KRAB_TEST_ETCD_PIDS"
echo "KRAB_TEST_ETCD_DIR=$KRAB_TEST_ETCD_DIR"
while :; do sleep 1 & wait $!; done
