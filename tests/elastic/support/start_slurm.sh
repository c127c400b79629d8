#!/usr/bin/env bash
# A private single-node Slurm for one test, as root and without systemd: munged (own key and
# socket), slurmctld -D and slurmd -D, all children of this script, with config, state, spool,
# logs and pid files in a fresh temp dir, on free loopback ports. Stopped and removed when this
# script ends (EXIT trap; a watchdog also stops them if this script is SIGKILLed).
#
#   start_slurm.sh [--auth munge|none] [-- COMMAND ARGS...]
#
# With COMMAND: runs it with these variables exported, and exits with its status:
#   SLURM_CONF            the private slurm.conf: sbatch, squeue, scancel, sinfo and srun all
#                         read it, so they talk to this cluster only
#   KRAB_TEST_SLURM_DIR   the temp dir (slurmctld.log, slurmd.log, munged.log)
# Without COMMAND: prints those two lines as NAME=VALUE, then waits until SIGTERM or SIGINT.
#
# The cluster: ClusterName=krabtest, one node "localhost" with CPUs=$(nproc), one default
# partition "t"; select/cons_tres with CR_CPU, so each one-task job takes one CPU (the default
# select/linear gives every job the whole node: one krab worker at a time); proctrack/linuxproc
# and task/none (no cgroups). Ready means `sinfo` shows the node idle (~1 s; bounded: 30 s).
#
# For SIGTERM to reach a batch job's program, submit it as `--wrap "exec PROGRAM ..."` and
# signal it with `scancel --batch --signal=TERM ID`: plain `scancel --signal=TERM` signals job
# steps only, never the batch script (docs/design/elastic.md §15.7). proctrack/linuxproc loses
# track of a job's process that outlives its parent, and a slurmstepd whose slurmd is gone
# stays; at the end this script kills every process that carries this cluster's SLURM_CONF in
# its environment and is a slurmstepd or has a SLURM_JOB_ID (this cluster's jobs only).
#
# --auth: munge (default; AuthType=auth/munge with a generated key) or none (auth/none, which
# Slurm 22.05 still ships; no munged). Exit codes: COMMAND's status; 77 skipped (not root, or
# slurmctld/slurmd/munged missing); 1 if the cluster did not start.
set -u

AUTH=munge
while (($#)); do
  case "$1" in
    --auth) AUTH=${2:?--auth needs munge or none}; shift 2 ;;
    --) shift; break ;;
    *) echo "start_slurm.sh: unknown argument '$1' (usage: start_slurm.sh [--auth munge|none] [-- CMD...])" >&2
       exit 2 ;;
  esac
done
[[ $AUTH == munge || $AUTH == none ]] || { echo "start_slurm.sh: --auth wants munge or none" >&2; exit 2; }
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "a private slurmd runs jobs as root here (running as uid $(id -u))"
for b in slurmctld slurmd sinfo scancel python3; do
  command -v "$b" >/dev/null || skip "no $b (scripts/setup.sh installs slurm-wlm)"
done
[[ $AUTH == none ]] || command -v munged >/dev/null || skip "no munged (scripts/setup.sh installs munge)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/krab-slurm-XXXXXX")
chmod 755 "$WORK"  # munged refuses a socket whose directories are not executable by all
PIDS=()
WATCHDOG=""
export SLURM_CONF=$WORK/slurm.conf

# The processes of this cluster's jobs and their slurmstepds (see the header), found by their
# environment: slurmd passes SLURM_CONF on to both.
job_pids() {
  local e d
  for e in /proc/[0-9]*/environ; do
    d=${e%/environ}
    grep -qxzsF "SLURM_CONF=$SLURM_CONF" "$e" || continue
    if grep -qzs '^SLURM_JOB_ID=' "$e" || [[ $(cat "$d/comm" 2>/dev/null) == slurmstepd ]]; then
      echo "${d#/proc/}"
    fi
  done
}
stop_all() {
  local p
  # Jobs first, while slurmd runs, so that their slurmstepds report back and exit (~0.5 s).
  scancel --full --signal=KILL --user=root >/dev/null 2>&1
  for _ in $(seq 50); do
    [[ -z $(timeout 2 squeue -h -o %i 2>/dev/null) ]] && break
    sleep 0.1
  done
  stop_pids 30  # the daemons stop in ~1.8 s on SIGTERM; a stuck slurmd does not
  for p in $(job_pids); do kill -KILL "$p" 2>/dev/null; done
  PIDS=()
}
# shellcheck source=tests/elastic/support/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"

read -r CTLD_PORT SLURMD_PORT < <(python3 -c 'import socket
ss=[socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')

start() {  # name, command... : a daemon as a child of this script, its output in name.out
  local name=$1; shift
  "$@" >"$WORK/$name.out" 2>&1 &
  PIDS+=($!)
  disown $!  # no "Killed" notice from bash when it is killed at the end
}

if [[ $AUTH == munge ]]; then
  head -c 1024 /dev/urandom >"$WORK/munge.key"
  chmod 400 "$WORK/munge.key"
  start munged munged -F --key-file="$WORK/munge.key" --socket="$WORK/munge.sock" \
    --pid-file="$WORK/munged.pid" --log-file="$WORK/munged.log" --seed-file="$WORK/munged.seed"
  for _ in $(seq 100); do [[ -S $WORK/munge.sock ]] && break; sleep 0.05; done
  [[ -S $WORK/munge.sock ]] || { echo "start_slurm.sh: munged did not start:" >&2; cat "$WORK/munged.out" >&2; exit 1; }
  AUTH_LINES="AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge.sock"
else
  AUTH_LINES="AuthType=auth/none
CredType=cred/none"
fi

mkdir -p "$WORK/state" "$WORK/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=krabtest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
$AUTH_LINES
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=localhost CPUs=$(nproc) State=UNKNOWN
PartitionName=t Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

start slurmctld slurmctld -D -f "$SLURM_CONF"
start slurmd slurmd -D -f "$SLURM_CONF" -N localhost
state=""
for _ in $(seq 300); do
  state=$(timeout 5 sinfo -h -o %t 2>/dev/null)
  [[ $state == idle ]] && break
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.1
done
if [[ $state != idle ]]; then
  echo "start_slurm.sh: the node is not idle (sinfo: '$state'); last log lines:" >&2
  tail -n 5 "$WORK"/*.out "$WORK"/*.log >&2 2>/dev/null
  exit 1
fi

# The watchdog outlives a SIGKILL of this script (which no trap sees) and then kills the
# daemons and the jobs' processes.
(
  trap '' HUP
  while kill -0 $$ 2>/dev/null; do sleep 1; done
  kill -KILL "${PIDS[@]}" 2>/dev/null
  for p in $(job_pids); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$WORK"
) >/dev/null 2>&1 &
WATCHDOG=$!

export KRAB_TEST_SLURM_DIR=$WORK
if (($#)); then
  "$@"
  exit $?
fi
echo "SLURM_CONF=$SLURM_CONF"
echo "KRAB_TEST_SLURM_DIR=$KRAB_TEST_SLURM_DIR"
while :; do sleep 1 & wait $!; done
