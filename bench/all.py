#!/usr/bin/python3
"""Every benchmark on the machine at hand, in one pass, and the table of docs/benchmarks.md
regenerated from that pass alone.

  /usr/bin/python3 bench/all.py --list            # the plan: each bench, its command, minutes
  sudo /usr/bin/python3 bench/all.py              # the full pass (hours; an idle machine)
  sudo /usr/bin/python3 bench/all.py --resume     # go on with the newest pass's folder
  sudo /usr/bin/python3 bench/all.py --quick      # smoke check of the runner (minutes)

Why one pass: the table used to gather rows measured on different CPUs (AVX2 and AVX-512 VMs),
quiet and loaded, weeks apart, so two rows could not be compared. Here every row comes from one
folder, bench/results/<date>-all/, written by one run of this script on one machine: each bench
of PLAN, in the table's order, is run through `summary.py record` (which keeps the output with
the date, commit, CPU, command and seconds), then `summary.py --write-doc` reads that folder
only. The peer (PyTorch DDP, krab's plain sync, torchrun, equal slices ...) is run by each bench
script itself, alternating with krab within a row, so load drifting during a pass of hours
falls on both sides of a ratio.

Before starting it checks that the machine is quiet: a one-minute load average above 0.5 per
core is reported, waited on (up to --wait-minutes) and then ends the pass, unless --force.
--quick runs each bench with its smallest settings into bench/results/<date>-all-quick/, marks
every record `note: quick` and never writes the page (summary.py refuses to): the numbers only
show that the runner and every script work. A bench that fails leaves its output in
<folder>/<name>.txt.failed and the pass goes on; the exit status is 1 if any failed. Needs root
for slow_network (network namespaces), zero_largest (cgroups) and elastic_autoscale's Slurm part.
"""
import argparse
import datetime
import glob
import os
import re
import shlex
import subprocess
import sys
import time

from record import cpu_name
from summary_records import REPO, read_paths

PY = "/usr/bin/python3"  # Debian's, the one with python3-torch

# (name, arguments of bench/<script>.py for the table, those of --quick, minutes to expect when
# no result file of that command says how long it took: the durations of the separate runs the
# table's rows came from, added up, from docs/benchmarks.md). The settings are the ones the table's
# "command" column recorded; where the table gathered several runs of one script (the slow
# network's configs, federated's parts) one run here measures them all side by side.
SLOW_CNN = ["--krab-config", "none:", "--krab-config", "topk:comm.compression=topk,comm.ratio=0.01",
            "--krab-config", "powersgd:comm.compression=powersgd,comm.rank=4"]
SLOW_GPT = ["--job", "gpt", "--rates", "100,20", "--krab-config", "none:",
            "--krab-config", "powersgd:comm.compression=powersgd,comm.rank=4",
            "--krab-config", "powersgd8:comm.compression=powersgd,comm.rank=8"]
PLAN = [
    ("throughput", ["--steps", "300", "--repeats", "3"], ["--steps", "20", "--repeats", "1"], 6),
    ("own_model_speed", ["--repeats", "5", "--ddp-scripted"],
     ["--steps", "20", "--repeats", "1", "--ddp-scripted"], 8),
    ("real_networks", ["--repeats", "4"],
     ["--steps", "4", "--short-steps", "2", "--repeats", "1"], 12),
    ("accuracy", [], ["--steps", "20"], 5),
    ("traffic", [], ["--steps", "10"], 1),
    ("compression", [], ["--steps", "20"], 18),
    ("slow_network-cnn", SLOW_CNN,
     ["--rates", "100", "--no-unshaped", "--steps", "20", "--eval-every", "10",
      "--link-check-seconds", "1", "--krab-config", "none:"], 55),
    ("slow_network-gpt", SLOW_GPT,
     ["--job", "gpt", "--rates", "100", "--no-unshaped", "--steps", "10", "--eval-every", "5",
      "--link-check-seconds", "1", "--krab-config", "none:"], 35),
    ("stragglers", [], ["--steps", "48", "--eval-every", "16"], 10),
    ("federated", [], ["--quick"], 38),
    ("images", ["--repeats", "3"], ["--images", "500", "--steps", "20"], 6),
    ("zero_memory", ["--widths", "256,512,1024", "--layers", "4", "--stages", "0,1,2,3",
                     "--steps", "3"], ["--widths", "256", "--stages", "0,1", "--steps", "2"], 3),
    ("zero_speed", ["--steps", "40", "--repeats", "2", "--models", "cnn,gpt", "--workers", "2,4",
                    "--stages", "0,1,2,3"],
     ["--steps", "10", "--repeats", "1", "--models", "cnn", "--workers", "2", "--stages", "0,1"],
     10),
    ("zero_largest", ["--runs", "ddp,s0,s3cb,s3cbo", "--cap-gib", "5", "--start",
                      "s3cbo=24x2048", "--max-m", "1300", "--timeout-s", "3600"],
     ["--quick", "--cap-gib", "1", "--max-m", "20", "--timeout-s", "300"], 45),
    ("elastic_kill", [], ["--trials", "1", "--epochs", "1"], 12),
    ("elastic_kill-zero3", ["--no-peer", "--trials", "3", "--epochs", "1", "--zero-stage", "3"],
     ["--no-peer", "--trials", "1", "--epochs", "1", "--zero-stage", "3"], 3),
    ("elastic_balance", [], ["--steps", "20", "--repeats", "1"], 4),
    ("elastic_balance-2w", ["--workers", "2"],
     ["--workers", "2", "--steps", "20", "--repeats", "1"], 3),
    ("elastic_autoscale", [], ["--steps", "60", "--fixed-steps", "20"], 6),
]


def script(name):
    return name.split("-", 1)[0]


def command(name, args, krab):
    return [PY, f"bench/{script(name)}.py"] + args + (["--krab", krab] if krab else [])


def durations(paths):
    """{command line: seconds of its newest run} from every record that says how long it ran:
    the `seconds` header `summary.py record` writes, else a "HH:MM–HH:MM" range in its date."""
    out = {}
    for rec in sorted(read_paths(paths), key=lambda r: r.when()):
        secs = rec.meta.get("seconds")
        if secs is None:
            m = re.search(r"(\d\d):(\d\d)\s*[–-]\s*(\d\d):(\d\d)", rec.meta.get("date", ""))
            if m:
                h0, m0, h1, m1 = map(int, m.groups())
                secs = ((h1 * 60 + m1 - h0 * 60 - m0) % (24 * 60)) * 60
        if secs is not None and rec.meta.get("command"):
            out[normal(rec.meta["command"])] = float(secs)
    return out


def normal(cmd):
    """A recorded command without what does not change the work: the python, --json FILE and
    --krab PATH."""
    words = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    keep, skip = [], False
    for w in words[1:] if words and "python" in words[0] else words:
        if skip:
            skip = False
        elif w in ("--json", "--krab"):
            skip = True
        else:
            keep.append(w)
    return " ".join(keep)


def plan(a, known):
    """[(name, command, estimated seconds, where the estimate comes from)] for this pass."""
    names = [n for n, *_ in PLAN]
    for opt in (a.only, a.skip):
        bad = [n for n in opt if n not in names]
        if bad:
            sys.exit(f"all: unknown bench {', '.join(bad)}; known: {', '.join(names)}")
    out = []
    for name, full, quick, minutes in PLAN:
        if (a.only and name not in a.only) or name in a.skip:
            continue
        cmd = command(name, quick if a.quick else full, a.krab)
        secs = known.get(normal(cmd))
        out.append((name, cmd, secs if secs is not None else (2 if a.quick else minutes) * 60,
                    "recorded" if secs is not None else "guess"))
    return out


def folder(a):
    """--dir; with --resume the pass folder last written to; else a fresh one, the date's (or
    the date and time's, when a pass of that day has a folder already: a fresh pass must not
    mix with an older one's records)."""
    if a.dir:
        return a.dir
    suffix = "-all-quick" if a.quick else "-all"
    results = os.path.join(REPO, "bench", "results")
    if a.resume:
        found = [d for d in glob.glob(os.path.join(results, "*" + suffix)) if os.path.isdir(d)]
        if found:
            return max(found, key=os.path.getmtime)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = os.path.join(results, now.strftime("%Y-%m-%d") + suffix)
    return day if not os.path.exists(day) else os.path.join(
        results, now.strftime("%Y-%m-%d-%H%M") + suffix)


def quiet_enough(a):
    """True when the one-minute load is at most 0.5 per core, waiting up to --wait-minutes for
    it; --force and --quick only report it."""
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + 60 * a.wait_minutes
    while True:
        with open("/proc/loadavg") as f:
            load = float(f.read().split()[0])
        if load <= 0.5 * cores:
            return True
        print(f"all: load average {load:.2f} on {cores} cores (over {0.5 * cores:g}): the "
              "numbers would measure the other work", flush=True)
        if a.force or a.quick:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(30)


def clock(secs):
    secs = int(secs)
    return f"{secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def run_pass(a, steps, out):
    """Runs what is not yet in `out` (all of it unless --resume); returns the failed names.
    "To go" is the estimates of the benches left: on a slower machine or a loaded one it runs
    behind, and the elapsed time beside it says by how much."""
    failed, start = [], time.monotonic()
    todo = [s for s in steps if not (a.resume and os.path.exists(os.path.join(out, s[0] + ".txt")))]
    left = sum(s[2] for s in todo)
    for i, (name, cmd, est, _) in enumerate(steps):
        path = os.path.join(out, name + ".txt")
        if (name, cmd, est, _) not in todo:
            print(f"all: [{i + 1}/{len(steps)}] {name}: recorded already, skipped", flush=True)
            continue
        print(f"\nall: [{i + 1}/{len(steps)}] {name} (about {clock(est)}); elapsed "
              f"{clock(time.monotonic() - start)}, about {clock(left)} to go: "
              f"{shlex.join(cmd)}", flush=True)
        rec = [PY, os.path.join(REPO, "bench", "summary.py"), "record"]
        rec += ["--note", "quick: smoke check, not a measurement"] if a.quick else []
        t0 = time.monotonic()
        rc = subprocess.call(rec + [path, "--"] + cmd, cwd=REPO)
        left -= est
        print(f"all: {name} {'done' if rc == 0 else f'FAILED (exit status {rc})'} in "
              f"{clock(time.monotonic() - t0)} (estimate {clock(est)}); elapsed "
              f"{clock(time.monotonic() - start)}, about {clock(left)} to go", flush=True)
        if rc != 0:
            failed.append(name)
    return failed


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    names = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--only", type=names, default=[], metavar="NAME,...")
    p.add_argument("--skip", type=names, default=[], metavar="NAME,...")
    p.add_argument("--quick", action="store_true", help="each bench's smallest settings")
    p.add_argument("--list", action="store_true", help="print the plan and stop")
    p.add_argument("--resume", action="store_true",
                   help="skip the benches whose record is in the folder already")
    p.add_argument("--dir", help="the pass's folder (default bench/results/<date>-all[-quick])")
    p.add_argument("--force", action="store_true", help="run on a loaded machine")
    p.add_argument("--wait-minutes", type=float, default=10,
                   help="how long to wait for a quiet machine before giving up")
    p.add_argument("--krab", default="", help="the krab binary (default: each script's, "
                   "build/bin/krab)")
    p.add_argument("--doc", default=os.path.join(REPO, "docs", "benchmarks.md"))
    a = p.parse_args(argv)
    steps = plan(a, durations([os.path.join(REPO, "bench", "results")] + sorted(
        d for d in glob.glob(os.path.join(REPO, "bench", "results", "*-all*")) if os.path.isdir(d))))
    print(f"all: CPU {cpu_name()}; {len(steps)} benches, about "
          f"{clock(sum(s for _, _, s, _ in steps))} in all{' (quick)' if a.quick else ''}")
    if a.list:
        for name, cmd, secs, src in steps:
            print(f"  {name:<20} {secs / 60:6.1f} min ({src})  {shlex.join(cmd)}")
        return 0
    if not quiet_enough(a):
        sys.exit("all: the machine stayed busy; stop the other work or pass --force")
    out = folder(a)
    os.makedirs(out, exist_ok=True)
    print(f"all: records in {os.path.relpath(out, REPO)}", flush=True)
    failed = run_pass(a, steps, out)
    summary = [PY, os.path.join(REPO, "bench", "summary.py"), out]
    # The page gets the table only from a whole pass: a part of one would drop the other rows.
    whole = all(os.path.exists(os.path.join(out, n + ".txt")) for n, *_ in PLAN
                if n not in a.skip)
    if not a.quick and whole:
        summary += ["--write-doc", a.doc]
    print("\nall: the table of this pass" + ("" if "--write-doc" in summary else
                                               " (not written to the page)"), flush=True)
    rc = subprocess.call(summary, cwd=REPO) if glob.glob(os.path.join(out, "*.txt")) else 1
    if failed:
        print(f"all: failed: {', '.join(failed)} (outputs in {out}/<name>.txt.failed); rerun "
              "them with --resume --only", flush=True)
    return 1 if failed or rc else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
