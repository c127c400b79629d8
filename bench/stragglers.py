#!/usr/bin/python3
"""Stragglers: one of four workers made 3x slower; what each synchronisation mode does with it.

What it measures: 4 workers on the CNN job of bench/common.py (per-worker batch 64, SGD 0.05 /
0.9, 1 thread per worker), rank 3 slowed by `train.slow_rank: 3, train.slow_factor: 3` (after
each forward+backward it sleeps twice the time that took). For each mode — sync, and local_sgd
with period 8 — with and without the straggler:
  - throughput: samples/s after warm-up (krab's report), and the slowed run's share of the
    unslowed one;
  - accuracy after the same wall time: test accuracy at the last evaluation (every --eval-every
    steps; evaluation time is not counted) within the training time the slowest run of sync
    took to finish, so every mode is judged at the same clock.
A sync step waits for the slowest worker, so the straggler sets the pace; local SGD waits only
at its model averages (every `period` steps), which still makes it wait for the straggler,
just less often: expect it to recover some of the loss, not all (async, which never waits,
will be added with the parameter server).

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/stragglers.py                  # 300 steps per run (~8 min)
  /usr/bin/python3 bench/stragglers.py --steps 60       # quick check
Options: --workers 4  --slow-rank 3  --slow-factor 3  --eval-every 48  --json FILE
It copies the krab binary to a temporary directory first. Exit status 1 if a run fails.
Everything runs on 127.0.0.1; nothing is downloaded.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from common import REPO, run_krab, write_cnn_job

MODES = {"sync": [], "local_sgd": ["sync.mode=local_sgd", "sync.period=8"]}


def accuracy_at(evals, seconds):
    """Test accuracy of the last evaluation done within `seconds` of training (0 if none)."""
    acc = 0.0
    for e in evals:
        if e["seconds"] <= seconds:
            acc = e["test_accuracy"]
    return acc


def main():
    p = argparse.ArgumentParser(description="krab with an artificial straggler")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=48)  # a multiple of the period: local
    # SGD is evaluated right after a model average, not on its diverged local models
    p.add_argument("--slow-rank", type=int, default=3)
    p.add_argument("--slow-factor", type=float, default=3.0)
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json")
    args = p.parse_args()
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"stragglers: {args.krab} is not an executable; build krab first")

    print(f"stragglers: {args.workers} workers, {args.steps} steps, rank {args.slow_rank} slowed "
          f"{args.slow_factor}x, evaluation every {args.eval_every} steps", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="krab-stragglers-") as tmp:
        krab = shutil.copy(args.krab, os.path.join(tmp, "krab"))
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "stragglers", os.path.join(tmp, "ck"))
        for mode, sets in MODES.items():
            for slowed in (False, True):
                name = f"{mode}{' slowed' if slowed else ''}"
                s = [f"parallel.workers={args.workers}", f"train.steps={args.steps}",
                     f"train.eval_every={args.eval_every}"] + sets
                if slowed:
                    s += [f"train.slow_rank={args.slow_rank}", f"train.slow_factor={args.slow_factor}"]
                r, elapsed = run_krab("stragglers", krab, job,
                                      os.path.join(tmp, name.replace(" ", "-") + ".json"), s)
                results[name] = r
                print(f"  {name:<17} {r['samples_per_sec']:7.0f} samples/s  train "
                      f"{r['train_seconds']:6.1f} s  test accuracy {r['test_accuracy']:.4f}",
                      flush=True)

    budget = results["sync slowed"]["train_seconds"]
    print(f"\nsame wall time: accuracy at {budget:.1f} s of training (when slowed sync finished)\n")
    print("| mode | samples/s unslowed | samples/s slowed | slowed / unslowed | slowed / sync slowed |"
          " accuracy at the same time (slowed) |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in MODES:
        fast, slow = results[mode], results[f"{mode} slowed"]
        print(f"| {mode} | {fast['samples_per_sec']:.0f} | {slow['samples_per_sec']:.0f} | "
              f"{slow['samples_per_sec'] / fast['samples_per_sec']:.2f} | "
              f"{slow['samples_per_sec'] / results['sync slowed']['samples_per_sec']:.2f} | "
              f"{accuracy_at(slow['evals'], budget):.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
