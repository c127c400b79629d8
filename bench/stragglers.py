#!/usr/bin/python3
"""Stragglers: one of four workers made 3x slower; what each synchronisation mode does with it.

What it measures: 4 workers on the CNN job of bench/common.py (per-worker batch 64, SGD 0.05 /
0.9, 1 thread per worker). The straggler is a fixed delay per step on rank 3
(`train.slow_rank: 3, train.slow_delay_ms: D`), calibrated in the same run: D = (factor - 1) x
the per-step time of the unslowed sync run, so rank 3 takes `factor` times as long per step as
the others did. (A delay proportional to the rank's own compute time misleads on 2 cores: the
more the others compute meanwhile, the longer its compute and so its sleep.) For each mode —
sync, local_sgd with period 8, async (parameter server, 1 server) without a staleness bound and
with max_staleness 4 — with and without the straggler:
  - throughput: samples/s after warm-up (krab's report), and the slowed run's share of the
    unslowed one;
  - accuracy after the same wall time: test accuracy at the last evaluation (every --eval-every
    global steps; evaluation time is not counted) within the training time slowed sync took to
    finish, so every mode is judged at the same clock.
A sync step waits for the slowest worker, so the straggler sets the pace; local SGD waits only
at its model averages; async never waits (unbounded) or waits only when a worker would get
more than 4 steps ahead of the straggler, and its job is the same number of gradients, whoever
computes them, so the fast workers do the straggler's share.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/stragglers.py                  # 300 steps per run (~10 min)
  /usr/bin/python3 bench/stragglers.py --steps 60       # quick check
Options: --workers 4  --slow-rank 3  --slow-factor 3  --slow-delay-ms D (skip calibration)
         --eval-every 48  --json FILE  --table-from FILE (the table of a saved run)
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

MODES = {
    "sync": [],
    "local_sgd": ["sync.mode=local_sgd", "sync.period=8"],
    "async": ["sync.mode=async", "sync.servers=1", "sync.max_staleness=-1"],
    "async s=4": ["sync.mode=async", "sync.servers=1", "sync.max_staleness=4"],
}


def accuracy_at(evals, seconds):
    """Test accuracy of the last evaluation done within `seconds` of training (0 if none)."""
    acc = 0.0
    for e in evals:
        if e["seconds"] <= seconds:
            acc = e["test_accuracy"]
    return acc


def table(results, delay_ms):
    """The summary table. Accuracy is read at two clocks: when the first slowed run finished
    training (who is ahead early) and when slowed sync finished (the straggler's full cost)."""
    early = min(r["train_seconds"] for n, r in results.items() if n.endswith("slowed"))
    late = results["sync slowed"]["train_seconds"]
    print(f"\nslow rank: {delay_ms:.1f} ms extra per step; accuracy of the slowed runs at "
          f"{early:.1f} s of training (first slowed run done) and {late:.1f} s (slowed sync "
          f"done)\n")
    print("| mode | samples/s unslowed | samples/s slowed | slowed / unslowed | slowed / sync slowed |"
          f" accuracy at {early:.0f} s (slowed) | accuracy at {late:.0f} s (slowed) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    modes = [n for n in results if not n.endswith("slowed")]
    for mode in modes:
        fast, slow = results[mode], results[f"{mode} slowed"]
        print(f"| {mode} | {fast['samples_per_sec']:.0f} | {slow['samples_per_sec']:.0f} | "
              f"{slow['samples_per_sec'] / fast['samples_per_sec']:.2f} | "
              f"{slow['samples_per_sec'] / results['sync slowed']['samples_per_sec']:.2f} | "
              f"{accuracy_at(slow['evals'], early):.4f} | {accuracy_at(slow['evals'], late):.4f} |")


def main():
    p = argparse.ArgumentParser(description="krab with an artificial straggler")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=48)  # a multiple of the period: local
    # SGD is evaluated right after a model average, not on its diverged local models
    p.add_argument("--slow-rank", type=int, default=3)
    p.add_argument("--slow-factor", type=float, default=3.0)
    p.add_argument("--slow-delay-ms", type=float, default=0,
                   help="fixed delay per step of the slow rank (default: calibrated)")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json")
    p.add_argument("--table-from", metavar="FILE",
                   help="print the table from a --json file of an earlier run, run nothing")
    args = p.parse_args()
    if args.table_from:
        with open(args.table_from) as f:
            saved = json.load(f)
        table(saved["results"], saved["slow_delay_ms"])
        return
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"stragglers: {args.krab} is not an executable; build krab first")

    print(f"stragglers: {args.workers} workers, {args.steps} steps, rank {args.slow_rank} slowed "
          f"{args.slow_factor}x, evaluation every {args.eval_every} steps", flush=True)
    results = {}
    delay_ms = args.slow_delay_ms
    with tempfile.TemporaryDirectory(prefix="krab-stragglers-") as tmp:
        krab = shutil.copy(args.krab, os.path.join(tmp, "krab"))
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "stragglers", os.path.join(tmp, "ck"))
        # The unslowed runs first, then the slowed ones, each round going through the modes:
        # the runs a ratio compares (async slowed against sync slowed) sit side by side in
        # time, so a change of load between them is as small as the order can make it. Sync
        # comes first, to calibrate the delay.
        for slowed in (False, True):
            for mode, sets in MODES.items():
                name = f"{mode}{' slowed' if slowed else ''}"
                s = [f"parallel.workers={args.workers}", f"train.steps={args.steps}",
                     f"train.eval_every={args.eval_every}"] + sets
                if slowed:
                    s += [f"train.slow_rank={args.slow_rank}", f"train.slow_delay_ms={delay_ms:.1f}"]
                r, elapsed = run_krab("stragglers", krab, job,
                                      os.path.join(tmp, name.replace(" ", "-").replace("=", "")
                                                   + ".json"), s)
                results[name] = r
                extra = ""
                if "async" in r:
                    steps = [w["steps"] for w in r["async"]["per_worker"]]
                    extra = (f"  steps per worker {steps}  staleness max "
                             f"{r['async']['max_staleness_seen']} mean "
                             f"{r['async']['mean_staleness']:.1f}")
                print(f"  {name:<17} {r['samples_per_sec']:7.0f} samples/s  train "
                      f"{r['train_seconds']:6.1f} s  test accuracy {r['test_accuracy']:.4f}{extra}",
                      flush=True)
                if name == "sync" and delay_ms <= 0:
                    step_ms = 1000.0 * r["global_batch"] / r["samples_per_sec"]
                    delay_ms = (args.slow_factor - 1) * step_ms
                    print(f"  calibrated: a sync step takes {step_ms:.1f} ms; the slow rank "
                          f"sleeps {delay_ms:.1f} ms per step", flush=True)

    table(results, delay_ms)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"slow_delay_ms": delay_ms, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
