# What the monitoring end-to-end scripts share (sourced, after they set PY): a temporary
# directory WORK removed on exit with every process in PIDS stopped, fail, a free loopback port,
# a GET on loopback, and the dashboard tests' browser (need_browser, browse). Sets WORK from its
# first argument, the directory's name prefix.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/${1:?lib.sh: a name prefix}-XXXXXX")
PIDS=()
cleanup() {
  local rc=$? p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
# FAIL_LOG: a file whose tail explains a failure (the run's output), shown with it.
fail() {
  echo "FAIL: $*" >&2
  [ -n "${FAIL_LOG:-}" ] && [ -f "$FAIL_LOG" ] && tail -n 20 "$FAIL_LOG" >&2
  exit 1
}
free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# GET on loopback only; prints the body.
get() { "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
# The dashboard tests' browser: exit 77 (skipped) without chromium or Debian's Chart.js, which
# the page draws with.
need_browser() {
  command -v chromium >/dev/null || { echo "SKIPPED: no chromium (scripts/setup.sh installs it)"; exit 77; }
  [ -f /usr/share/javascript/chart.js/chart.min.js ] ||
    { echo "SKIPPED: no Chart.js (libjs-chart.js; scripts/setup.sh installs it)"; exit 77; }
}
# Headless Chromium (as root it needs --no-sandbox); its profile and crash files stay in WORK.
browse() {
  timeout -k 5 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --user-data-dir="$WORK/profile" --hide-scrollbars "$@" 2>>"$WORK/chromium.log"
}
# screenshot URL FILE SIZE: a screenshot of the page at URL (SIZE as W,H) into FILE, which must be
# a PNG larger than a blank page (a few KB): the charts were drawn.
screenshot() {
  mkdir -p "$(dirname "$2")"
  rm -f "$2"
  browse --virtual-time-budget=5000 --window-size="$3" --screenshot="$2" "$1" >/dev/null ||
    fail "chromium could not take the screenshot"
  [ -f "$2" ] || fail "no screenshot at $2"
  head -c 8 "$2" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || fail "$2 is not a PNG"
  local size
  size=$(stat -c %s "$2")
  [ "$size" -gt 40000 ] || fail "the screenshot is only $size bytes: the charts were not drawn"
  echo "screenshot: $2 ($size bytes)"
}
