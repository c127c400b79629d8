#!/usr/bin/env bash
# elastic.autoscale.provider slurm end to end (docs/design/elastic.md §8, §12 item 7), on a
# private single-node Slurm (support/start_slurm.sh: munged, slurmctld, slurmd, all children of
# this test): the CNN job of the local autoscale case (tests/cli/elastic_e2e_test.cpp), from 1
# worker up to elastic.max_workers 4, each added worker a Slurm batch job that joins through the
# run's store file (the job runs on this machine). Asserts:
#   - the run completes all its steps, exit 0, and the policy says it settled;
#   - at least one worker came from Slurm and joined (a slurm-<id>.out and a join record);
#   - every decision of RUN_DIR/autoscale.json follows from its recorded rates and the
#     thresholds: re-derived here in Python from the measured sizes (the rates and efficiency
#     each decision used, and whether it should add or remove);
#   - every membership change is a proposal with 0 steps lost, ending at the policy's size;
#   - on a 2-core machine the final size is at most 2;
#   - nothing is left: squeue lists no job, and no process runs in the test's directory.
#
#   slurm_autoscale.sh KRAB [PYTHON]
# Exit: 0 pass, 1 fail, 77 skipped (not root, or no slurmctld/slurmd/munged: start_slurm.sh's
# reasons). Bounded: the run itself by RUN_LIMIT seconds (below ctest's TIMEOUT).
set -u
KRAB=$(realpath "${1:?usage: slurm_autoscale.sh KRAB [PYTHON]}")
PY=${2:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN_LIMIT=${RUN_LIMIT:-200}

# Not yet under the private cluster: start it and run this script again under it.
if [[ -z ${KRAB_TEST_SLURM_DIR:-} ]]; then
  command -v slurmctld >/dev/null || { echo "SKIPPED: no slurmctld (scripts/setup.sh installs slurm-wlm)"; exit 77; }
  exec bash "$HERE/support/start_slurm.sh" -- bash "${BASH_SOURCE[0]}" "$@"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/krab-slurm-as-XXXXXX")
RUN=$WORK/run  # the job's directory: the launcher's, and its Slurm jobs', working directory
mkdir "$RUN"
fail() { echo "FAIL: $*" >&2; exit 1; }
# Whatever this test started in RUN (the launcher, its workers, Slurm's jobs: their working
# directory is RUN; this script's is not) is stopped whatever happens; start_slurm.sh then stops
# the daemons.
procs_in_work() {
  local d
  for d in /proc/[0-9]*; do
    [[ $(readlink "$d/cwd" 2>/dev/null) == "$RUN" ]] && echo "${d#/proc/}"
  done
}
cleanup() {
  local rc=$? p
  for p in $(procs_in_work); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

cat >"$RUN/job.yaml" <<'EOF'
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 128}
train: {steps: 500, eval_examples: 500, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 1}
elastic: {enabled: true, max_workers: 4, wait_s: 30,
          autoscale: {provider: slurm, window_steps: 8, cooldown_steps: 30}}
EOF

start=$SECONDS
(cd "$RUN" && exec timeout -k 5 "$RUN_LIMIT" "$KRAB" train job.yaml --report as.json \
  --set checkpoint.dir=as) >"$WORK/run.log" 2>&1
code=$?
echo "krab train exited $code after $((SECONDS - start)) s; its log:"
grep -E '^krab: (autoscale|generation)' "$WORK/run.log"
if [[ $code -ne 0 ]]; then
  tail -n 30 "$WORK/run.log"
  for f in "$RUN"/as/slurm-*.out; do [[ -f $f ]] && { echo "== $f"; tail -n 10 "$f"; }; done
  fail "krab train exited $code"
fi

# Nothing left: the launcher cancels what it submitted before it exits.
left=$(timeout 10 squeue -h -o '%i %T %j')
[[ -z $left ]] || fail "squeue still lists: $left"
sleep_until=$((SECONDS + 5))  # a worker's process may take a moment to be reaped after its job
while [[ -n $(procs_in_work) && $SECONDS -lt $sleep_until ]]; do sleep 0.1; done
[[ -z $(procs_in_work) ]] || fail "processes left in the test's directory: $(procs_in_work)"

ls "$RUN"/as/slurm-*.out >/dev/null 2>&1 || fail "no Slurm job ran a worker (no as/slurm-*.out)"

"$PY" - "$RUN/as/autoscale.json" "$RUN/as.json" "$(nproc)" <<'EOF' || fail "autoscale.json"
import json, sys
scale = json.load(open(sys.argv[1]))
report = json.load(open(sys.argv[2]))
cores = int(sys.argv[3])
UP, DOWN = 0.6, 0.3
errors = []
def check(ok, what):
    if not ok:
        errors.append(what)

check(report["steps"] == 500, f"steps {report['steps']} != 500")
check(scale["settled"], "the policy did not settle")
sizes, decisions = scale["sizes"], scale["decisions"]
check(decisions and decisions[0]["action"] == "add", "the first decision is not an addition")

def latest(workers, step):
    """The latest measurement of `workers` completed at or before `step`."""
    rates = [s for s in sizes if s["workers"] == workers and s["step"] <= step]
    return rates[-1]["rate"] if rates else None

def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))

for d in decisions:
    w, step = d["from"], d["step"]
    rate, below = latest(w, step), latest(w - 1, step)
    check(rate is not None and close(rate, d["rate"]), f"{d}: rate of {w} measured {rate}")
    e = None
    if below is not None:
        check("rate_below" in d and close(below, d["rate_below"]), f"{d}: rate of {w-1} {below}")
        e = (rate - below) / (below / (w - 1))
        check("efficiency" in d and close(e, d["efficiency"]), f"{d}: efficiency {e}")
    else:
        check("efficiency" not in d, f"{d}: an efficiency without a measured size below")
    if d["action"] == "add":
        check(d["to"] == w + 1 and w < 4, f"{d}: an addition to {d['to']}")
        check(e is None or e >= UP, f"{d}: added with e {e} < up {UP}")
    else:
        check(d["to"] == w - 1, f"{d}: a removal to {d['to']}")
        check(e is not None and e < DOWN, f"{d}: removed with e {e} >= down {DOWN}")

workers, joins = 1, 0
for change in report.get("membership", []):
    check(change["kind"] == "proposal", f"not a proposal: {change}")
    check(change["lost_steps"] == 0, f"steps lost: {change}")
    joins += change["workers"] > workers
    workers = change["workers"]
check(joins >= 1, "no worker joined")
check(workers == scale["workers"], f"membership ends at {workers}, the policy at {scale['workers']}")
if cores == 2:
    check(workers <= 2, f"{workers} workers at the end on 2 cores")
for i, s in enumerate(sizes):  # the last window of each stint at one size
    if i + 1 == len(sizes) or sizes[i + 1]["workers"] != s["workers"]:
        print(f"  size {s['workers']}: {s['rate']:.0f} samples/s (window ending at step {s['step']})")
for d in decisions:
    print(f"  step {d['step']}: {d['action']} {d['from']} -> {d['to']} ({d['reason']})")
print(f"  settled at {workers} worker(s)")
if errors:
    print("\n".join(errors))
    sys.exit(1)
EOF
echo "PASS"
