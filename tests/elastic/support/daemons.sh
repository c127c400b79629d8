# shellcheck shell=bash
# Sourced by start_etcd.sh and start_slurm.sh: stopping the daemons a script started, and the
# traps that do it however the script ends. The script sets WORK (its temp dir), PIDS (the
# daemons' pids) and WATCHDOG (empty, or the pid of its watchdog), and defines stop_all.

# SIGTERM to every pid of PIDS, up to $1 tenths of a second for them to go, then SIGKILL.
stop_pids() {
  local p tenths=$1
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq "$tenths"); do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
}

# On any exit: stop the watchdog, stop_all, remove WORK, keep the exit status. A signal becomes
# an exit with 128 + its number, so the EXIT trap runs for it too.
cleanup() {
  local rc=$?
  [[ -n $WATCHDOG ]] && kill "$WATCHDOG" 2>/dev/null
  stop_all
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
