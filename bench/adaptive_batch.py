#!/usr/bin/python3
"""Adaptive batch: time to a target test accuracy, train.adaptive_batch against every fixed batch.

What it measures (issue 28, item 4): on W workers (default 2), the training seconds (evaluations
left out: the report's `evals` seconds) until the first evaluation at or above --target, for
  fixed   data.batch_size B for every B of --batches (default 64,128,256,512): a global batch of
          B x W, the learning rate scaled from the job's (set for B = 64) by the rule the
          adaptive batch uses: linearly for sgd, by the square root for adam;
  adaptive  data.batch_size 64, train.adaptive_batch {min: 64 x W, max: 512 x W}, the overhead
          measured (train.adaptive_batch.overhead_examples 0): no sweep, one run.
Every run evaluates after the same numbers of examples (--eval-examples, default 10240: every
80 steps of 128, every 10 of 1024), on the whole test split, and trains the same examples (the
cnn --epochs 3; the gpt --steps 600 of the smallest batch). The fixed runs and the adaptive run
alternate within each repeat (--repeats, default 1). PASS when the adaptive run's time is at most
the best fixed batch's (its median over repeats), with --slack (default 0.10) for the noise of
single runs on a shared machine, which the output shows beside it.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/adaptive_batch.py                 # cnn, about 8 minutes idle
  /usr/bin/python3 bench/adaptive_batch.py --job gpt       # the gpt on text, target 0.33
Options: --workers 2  --batches 64,128,256,512  --target (cnn 0.88, gpt 0.33)  --epochs 3
  --steps N (gpt: 600)  --repeats 1  --json FILE  --krab build/bin/krab
It copies the krab binary to a temporary directory first. Exit status 1 if a run fails.
Everything runs on 127.0.0.1; nothing is downloaded.
"""
import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import REPO, machine_load, run_krab, write_cnn_job, write_gpt_job, write_text_corpus

BASE_BATCH = 64


def cpu_name():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def time_to(report, target):
    """(training seconds, step) of the first evaluation at or above target, or None."""
    for e in report.get("evals") or []:
        if e.get("test_accuracy", -1) >= target:
            return e["seconds"], e["step"]
    return None


def settings(args, job_opt, batch, adaptive):
    """krab --set overrides of one run: every run trains the same examples and evaluates after
    the same ones."""
    w = args.workers
    sets = [f"parallel.workers={w}", "train.threads_per_worker=1",
            f"data.batch_size={batch}",
            f"train.eval_every={max(1, args.eval_examples // (batch * w))}"]
    if args.job == "cnn":
        sets.append(f"train.epochs={args.epochs}")
    else:  # the adaptive run's steps count steps of its smallest batch, 64 x W
        sets.append(f"train.steps={max(1, args.steps * BASE_BATCH // batch)}")
    name, lr = job_opt
    sets += [f"train.optimizer.name={name}"]
    if adaptive:
        return sets + [f"train.optimizer.lr={lr:g}", f"train.adaptive_batch.max={512 * w}",
                       f"train.adaptive_batch.min={BASE_BATCH * w}"]
    ratio = batch / BASE_BATCH
    scaled = lr * (ratio if name == "sgd" else math.sqrt(ratio))
    return sets + [f"train.optimizer.lr={scaled:g}"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=["cnn", "gpt"], default="cnn")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", default="64,128,256,512")
    p.add_argument("--target", type=float)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-examples", type=int, default=10240)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--slack", type=float, default=0.10)
    p.add_argument("--json")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    args = p.parse_args()
    target = args.target or (0.88 if args.job == "cnn" else 0.33)
    batches = [int(b) for b in args.batches.split(",")]
    tmp = tempfile.mkdtemp(prefix="krab-adaptive-")
    krab = os.path.join(tmp, "krab")
    shutil.copy2(args.krab, krab)
    if args.job == "cnn":
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "bench-adaptive", tmp + "/ckpt")
        job_opt = ("adam", 0.003)  # examples/fashion_cnn.yaml's optimizer, at a constant rate
    else:
        corpus = os.path.join(tmp, "corpus.txt")
        write_text_corpus(corpus)
        job = write_gpt_job(os.path.join(tmp, "job.yaml"), "bench-adaptive-gpt", tmp + "/ckpt",
                            corpus)
        job_opt = ("adam", 0.01)
    print(f"adaptive batch, {args.job}, {args.workers} workers, target {target}, "
          f"CPU {cpu_name()}, load {machine_load()}", flush=True)
    runs = {f"fixed {b}": [] for b in batches}
    runs["adaptive"] = []
    records = []
    for rep in range(args.repeats):
        for name in list(runs):
            adaptive = name == "adaptive"
            batch = BASE_BATCH if adaptive else int(name.split()[1])
            sets = settings(args, job_opt, batch, adaptive)
            sets.append(f"checkpoint.dir={os.path.join(tmp, 'ckpt', name.replace(' ', '-'))}")
            report, elapsed = run_krab("adaptive_batch", krab, job,
                                       os.path.join(tmp, "report.json"), sets)
            reached = time_to(report, target)
            runs[name].append(reached[0] if reached else math.inf)
            extra = ""
            if adaptive:
                changes = report["adaptive_batch"]["changes"]
                extra = " batches " + ", ".join(f"{c['batch']}@{c['examples_before']}"
                                                for c in changes)
            print(f"  {name:>10} (global {batch * args.workers if not adaptive else 'adaptive'}):"
                  f" {'%.1f s' % reached[0] if reached else 'not reached'}"
                  f" (final acc {report.get('test_accuracy', 0):.4f},"
                  f" {report['samples_per_sec']:.0f} samples/s){extra}", flush=True)
            records.append({"repeat": rep, "name": name, "sets": sets, "report": report,
                            "seconds_to_target": reached[0] if reached else None,
                            "process_seconds": elapsed})
    med = {n: statistics.median(v) for n, v in runs.items()}
    best = min((n for n in med if n != "adaptive"), key=lambda n: med[n])
    ratio = med["adaptive"] / med[best] if math.isfinite(med[best]) else math.inf
    verdict = "PASS" if ratio <= 1 + args.slack else "MISS"
    print(f"best fixed: {best}, {med[best]:.1f} s; adaptive {med['adaptive']:.1f} s: "
          f"{ratio:.3f}x the best fixed ({verdict}, slack {args.slack:.0%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": target, "medians": med, "best_fixed": best, "ratio": ratio,
                       "verdict": verdict, "cpu": cpu_name(), "runs": records}, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
