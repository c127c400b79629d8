#!/usr/bin/python3
"""Autoscaling: where the local and the Slurm provider settle from 1 worker, and how fast each
size they visited ran.

What it measures (issue 27, "what it must show" item 7; docs/design/elastic.md §8, §12.1 item
5): the CNN job of bench/common.py with a global batch of B = 256 (data.batch_size 256 on the
1 starting worker: the global batch stays the starting world's, §5.1), `elastic.enabled`,
`elastic.max_workers` 4, `elastic.autoscale.window_steps` 8 and `cooldown_steps` 30, run once
with `provider: local` (each added worker a process of the launcher) and once with `provider:
slurm` (each added worker a one-task batch job of a private single-node Slurm that
tests/elastic/support/start_slurm.sh starts for the run, as root). For each: the sizes the
policy visited with the samples/s it measured at each (RUN_DIR/autoscale.json's latest window
per size, and the median of its windows), its decisions, where it settled, the run's wall time
and the report's samples/s. Then, as the independent check of where it should settle, fixed-
size runs (no elastic) at 1..max workers on the same global batch (data.batch_size 256 / W).

Run from the repository root with Debian's python, as root for the Slurm part:
  /usr/bin/python3 bench/elastic_autoscale.py                 # 400 steps, fixed runs of 100
  /usr/bin/python3 bench/elastic_autoscale.py --steps 200 --fixed-steps 0   # quick, no fixed
Options: --steps 400  --max-workers 4  --fixed-steps 100  --providers local,slurm
--krab build/bin/krab  --json FILE. Without root or Slurm the slurm run is reported as skipped.
Exit status 1 if a run fails. Everything runs on this machine; nothing is downloaded.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import REPO, fail, machine_load, run_krab, write_cnn_job
from zero_speed import cpu_name

START_SLURM = os.path.join(REPO, "tests", "elastic", "support", "start_slurm.sh")
BATCH = 256


def autoscale_sets(a, provider):
    return ["parallel.workers=1", f"data.batch_size={BATCH}", f"train.steps={a.steps}",
            "train.eval_every=0", "elastic.enabled=true", f"elastic.max_workers={a.max_workers}",
            f"elastic.autoscale.provider={provider}", "elastic.autoscale.window_steps=8",
            "elastic.autoscale.cooldown_steps=30", "elastic.wait_s=30"]


def run_autoscale(a, krab, job, tmp, provider):
    """One autoscaled run; returns what it visited and where it settled, or None (skipped)."""
    report = os.path.join(tmp, f"as-{provider}.json")
    ckpt = os.path.join(tmp, f"ck-{provider}")
    sets = autoscale_sets(a, provider) + [f"checkpoint.dir={ckpt}"]
    cmd = [krab, "train", job, "--report", report]
    for s in sets:
        cmd += ["--set", s]
    if provider == "slurm":
        cmd = ["bash", START_SLURM, "--"] + cmd
    load, _ = machine_load()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode == 77:
        return {"provider": provider, "skipped": proc.stdout.strip() or proc.stderr.strip()}
    if proc.returncode != 0 or not os.path.exists(report):
        fail("elastic_autoscale", cmd, proc)
    with open(report) as f:
        r = json.load(f)
    run_dir = ckpt  # checkpoint.dir without {name}: the run directory itself
    with open(os.path.join(run_dir, "autoscale.json")) as f:
        scale = json.load(f)
    sizes = {}
    for s in scale["sizes"]:
        sizes.setdefault(s["workers"], []).append(s["rate"])
    slurm_jobs = len([n for n in os.listdir(run_dir) if n.startswith("slurm-")])
    return {"provider": provider, "settled_at": scale["workers"], "settled": scale["settled"],
            "sizes": {w: {"latest": v[-1], "median": statistics.median(v), "windows": len(v)}
                      for w, v in sorted(sizes.items())},
            "decisions": scale["decisions"], "samples_per_sec": r["samples_per_sec"],
            "wall_s": wall, "load1": load, "slurm_jobs": slurm_jobs}


def run_fixed(a, krab, job, tmp, workers):
    sets = [f"parallel.workers={workers}", f"data.batch_size={BATCH // workers}",
            f"train.steps={a.fixed_steps}", "train.eval_every=0",
            f"checkpoint.dir={os.path.join(tmp, f'ck-fixed-{workers}')}"]
    r, _ = run_krab("elastic_autoscale", krab, job, os.path.join(tmp, f"fixed-{workers}.json"),
                    sets)
    return r["samples_per_sec"]


def main():
    p = argparse.ArgumentParser(description="autoscale from 1 worker: local vs slurm provider")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--max-workers", type=int, default=4)
    p.add_argument("--fixed-steps", type=int, default=100, help="0: no fixed-size runs")
    p.add_argument("--providers", default="local,slurm")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    a = p.parse_args()
    if not os.access(a.krab, os.X_OK):
        sys.exit(f"elastic_autoscale: {a.krab} is not an executable; build krab first")
    out = {"bench": "elastic_autoscale", "cpu": cpu_name(), "steps": a.steps, "runs": [],
           "fixed": {}}
    with tempfile.TemporaryDirectory(prefix="krab-autoscale-") as tmp:
        os.chmod(tmp, 0o755)  # a Slurm job (root here, but its own session) reads the job file
        krab = os.path.join(tmp, "krab")
        shutil.copy2(a.krab, krab)
        job = write_cnn_job(os.path.join(tmp, "cnn.yaml"), "bench-autoscale",
                            os.path.join(tmp, "ck"))
        print(f"elastic_autoscale: {out['cpu']}; CNN, global batch {BATCH}, from 1 worker, "
              f"max {a.max_workers}, {a.steps} steps, window 8, cooldown 30", flush=True)
        for provider in a.providers.split(","):
            r = run_autoscale(a, krab, job, tmp, provider)
            out["runs"].append(r)
            if "skipped" in r:
                print(f"\n{provider}: skipped ({r['skipped']})", flush=True)
                continue
            print(f"\n{provider}: settled at {r['settled_at']} worker(s) (settled: "
                  f"{r['settled']}), {r['samples_per_sec']:.0f} samples/s over the run, "
                  f"{r['wall_s']:.0f} s wall, load1 {r['load1']:.2f}"
                  + (f", {r['slurm_jobs']} Slurm job(s)" if provider == "slurm" else ""),
                  flush=True)
            for d in r["decisions"]:
                print(f"  step {d['step']:>4}: {d['action']:<6} {d['from']} -> {d['to']}  "
                      f"({d['reason']})", flush=True)
        for w in range(1, a.max_workers + 1) if a.fixed_steps > 0 else ():
            out["fixed"][w] = run_fixed(a, krab, job, tmp, w)
    print()
    header = "| workers | " + " | ".join(f"{r['provider']} (samples/s, latest / median)"
                                         for r in out["runs"] if "skipped" not in r)
    if out["fixed"]:
        header += " | fixed size (samples/s)"
    print(header + " |")
    print("|--:|" + "--:|" * (header.count("|") - 1))
    for w in range(1, a.max_workers + 1):
        cells = []
        for r in out["runs"]:
            if "skipped" in r:
                continue
            s = r["sizes"].get(w)
            cells.append(f"{s['latest']:.0f} / {s['median']:.0f}" if s else "-")
        if out["fixed"]:
            cells.append(f"{out['fixed'][w]:.0f}")
        print(f"| {w} | " + " | ".join(cells) + " |")
    settled = ", ".join(f"{r['provider']} at {r['settled_at']}" for r in out["runs"]
                        if "skipped" not in r)
    best = max(out["fixed"], key=out["fixed"].get) if out["fixed"] else None
    print(f"\nsettled: {settled}" + (f"; fastest fixed size: {best}" if best else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
