#!/usr/bin/python3
"""Monitoring overhead: samples/s with monitoring on against off, alternating, in one invocation.

What it does: trains krab's `cnn` on Fashion-MNIST (bench/common.py's CNN job: batch 64 per
worker, SGD with momentum) on 2 workers for S steps (default 200), in turn:

  off        monitor.port 0, no --trace: what every run pays (the step phases' spans still
             reach the bottleneck report's sink)
  endpoint   monitor.port and monitor.dashboard on, scraped as a user would watch it: /metrics
             every second (Prometheus) and /api/history every second (an open dashboard page)
  trace      --trace FILE: every span of every rank streamed to its part file
  all        both

R times round (default 5), the configurations alternating within each round, so that a machine
whose speed drifts drifts for all of them. Prints the median samples/s (after krab's warm-up)
of each and its ratio to `off`: the goal is >= 0.99 (issue 28: monitoring costs at most 1%).
The CPU model and core count are printed beside the numbers; a markdown table for
bench/summary.py. A configuration the binary does not have (--trace before it was built) is
left out with a note.

Run from the repository root:
  /usr/bin/python3 bench/monitor_overhead.py                  # 200 steps, 5 rounds
  /usr/bin/python3 bench/monitor_overhead.py --steps 60 --repeats 1   # quick check
Options: --krab build/bin/krab  --json FILE (raw results)
Exit status 1 if a run fails. Nothing is downloaded; the scrapes go to 127.0.0.1 only.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import machine_load, write_cnn_job
from record import cpu_name


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watcher:
    """GETs /metrics and /api/history of 127.0.0.1:port once a second while the run lasts."""

    def __init__(self, port):
        self.port, self.stop, self.answers = port, threading.Event(), 0
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self):
        while not self.stop.wait(1.0):
            for path in ("/metrics", "/api/history"):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2).read()
                    self.answers += 1
                except OSError:
                    pass  # not listening yet, or already gone

    def close(self):
        self.stop.set()
        self.thread.join()
        return self.answers


def has_trace(krab):
    out = subprocess.run([krab, "train", "--help"], capture_output=True, text=True)
    return "--trace" in out.stdout + out.stderr


def run_one(krab, job, tmp, name, steps):
    sets = [f"train.steps={steps}", "parallel.workers=2"]
    extra, watcher = [], None
    if name in ("endpoint", "all"):
        port = free_port()
        sets += [f"monitor.port={port}", "monitor.dashboard=true"]
        watcher = Watcher(port)
    if name in ("trace", "all"):
        extra = ["--trace", os.path.join(tmp, f"{name}.trace.json")]
    load = machine_load()
    report, seconds = run_with(krab, job, tmp, name, sets, extra)
    answers = watcher.close() if watcher else 0
    return {"samples_per_sec": report["samples_per_sec"], "process_seconds": round(seconds, 2),
            "scrapes_answered": answers, "load_before": load[0], "compilers_running": load[1]}


def run_with(krab, job, tmp, name, sets, extra):
    """`krab train job --report ... EXTRA --set ...` (EXTRA: --trace FILE or nothing); exits on
    failure. Returns (the report, the process's seconds)."""
    report = os.path.join(tmp, f"{name}.json")
    cmd = [krab, "train", job, "--report", report] + extra
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        sys.exit(1)
    with open(report) as f:
        return json.load(f), elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--krab", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "build", "bin", "krab"))
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="krab-monitor-bench-")
    try:
        krab = shutil.copy(args.krab, os.path.join(tmp, "krab"))  # a rebuild cannot swap it
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "monitor-bench",
                            os.path.join(tmp, "runs"))
        names = ["off", "endpoint", "trace", "all"]
        if not has_trace(krab):
            print("note: this krab has no --trace: the trace and all rows are left out")
            names = ["off", "endpoint"]
        each = {n: [] for n in names}
        for _ in range(args.repeats):
            for n in names:
                each[n].append(run_one(krab, job, tmp, n, args.steps))
        base = statistics.median(r["samples_per_sec"] for r in each["off"])
        results = {"cpu": cpu_name(), "steps": args.steps, "workers": 2,
                   "repeats": args.repeats, "runs": {}}
        print(f"cnn on Fashion-MNIST, 2 workers x 64, {args.steps} steps, median of "
              f"{args.repeats} alternating runs; {results['cpu']}")
        print("| monitoring | samples/s | vs off | goal |")
        print("|---|---:|---:|---:|")
        for n in names:
            med = statistics.median(r["samples_per_sec"] for r in each[n])
            results["runs"][n] = {"samples_per_sec": med, "ratio": med / base, "each": each[n]}
            print(f"| {n} | {med:,.0f} | {med / base:.3f} | >= 0.99 |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        print(json.dumps(results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
