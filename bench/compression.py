#!/usr/bin/python3
"""Compression and synchronisation modes: traffic and accuracy, each against plain sync.

What it measures, for every mode (4 workers, CNN, Fashion-MNIST, per-worker batch 64, SGD lr
0.05 momentum 0.9 constant, 1 thread per worker, 2 epochs by default — the CNN job of
bench/common.py):
  - traffic: the comm layer's own meter over the training steps (`bytes_sent_steps` in krab's
    report: every payload byte all workers sent, without the initial parameter broadcast),
    divided by plain sync's, beside the bound issue 3 sets for that mode;
  - accuracy: test accuracy on the whole 10k test split, and its difference from plain sync's;
  - samples/s (4 processes on 2 cores: compute-bound; not a speed comparison).
Modes: sync (fp32 all-reduce), fp16, bf16, int8, onebit, topk 0.01, randomk 0.1, powersgd rank
4, local_sgd period 8 (defaults of the comm.* keys otherwise: error feedback on, no warm-up,
parameters under 1024 values uncompressed), async (parameter server, 1 server) unbounded and
with max_staleness 2.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/compression.py                    # the full benchmark (~15 min)
  /usr/bin/python3 bench/compression.py --steps 40         # quick check
  /usr/bin/python3 bench/compression.py --modes sync,int8  # a subset
Options: --workers 4  --epochs 2  --json FILE (all reports)  --krab build/bin/krab
  --set MODE:KEY=VALUE (repeatable) adds a krab setting to one mode
  --set-all KEY=VALUE (repeatable) adds one to every mode (before the modes' own), e.g.
      --set-all train.lr_schedule=cosine --set-all train.seed=1
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

# name -> (krab --set overrides, traffic bound relative to sync from issue 3, or None)
MODES = {
    "sync": ([], None),
    "fp16": (["comm.compression=fp16"], 0.52),
    "bf16": (["comm.compression=bf16"], None),
    "int8": (["comm.compression=int8"], 0.27),
    "onebit": (["comm.compression=onebit"], 0.04),
    "topk": (["comm.compression=topk", "comm.ratio=0.01"], 0.03),
    "randomk": (["comm.compression=randomk", "comm.ratio=0.1"], None),
    "powersgd": (["comm.compression=powersgd", "comm.rank=4"], 0.05),
    "local_sgd": (["sync.mode=local_sgd", "sync.period=8"], 0.13),
    # The parameter server moves the gradient up and the parameters down every step (8n bytes
    # per worker and step against the ring's 2(W-1)/W * 4n): it trades traffic for not waiting.
    "async": (["sync.mode=async", "sync.servers=1", "sync.max_staleness=-1"], None),
    "async_s2": (["sync.mode=async", "sync.servers=1", "sync.max_staleness=2"], None),
}


def main():
    p = argparse.ArgumentParser(description="krab compression / sync modes vs plain sync")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="fixed steps instead of epochs")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--set", action="append", default=[], metavar="MODE:KEY=VALUE",
                   help="extra krab setting for one mode, e.g. onebit:comm.compress_warmup_steps=50")
    p.add_argument("--set-all", action="append", default=[], metavar="KEY=VALUE",
                   help="krab setting for every mode, e.g. train.lr_schedule=cosine")
    p.add_argument("--json")
    args = p.parse_args()
    for extra in args.set:
        mode, _, kv = extra.partition(":")
        if mode not in MODES or "=" not in kv:
            sys.exit(f"compression: --set wants MODE:KEY=VALUE with a known mode, got '{extra}'")
        MODES[mode] = (MODES[mode][0] + [kv], MODES[mode][1])
    for kv in args.set_all:
        if "=" not in kv:
            sys.exit(f"compression: --set-all wants KEY=VALUE, got '{kv}'")
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"compression: unknown mode '{m}' (choose from {', '.join(MODES)})")
    if "sync" not in modes:
        modes.insert(0, "sync")
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"compression: {args.krab} is not an executable; build krab first")

    length = f"{args.steps} steps" if args.steps else f"{args.epochs} epochs"
    print(f"compression: {args.workers} workers x batch 64, CNN, {length}, SGD 0.05/0.9, "
          f"1 thread per worker" + "".join(f", {kv}" for kv in args.set_all), flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="krab-compression-") as tmp:
        krab = shutil.copy(args.krab, os.path.join(tmp, "krab"))
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "compression", os.path.join(tmp, "ck"))
        for m in modes:
            sets = [f"parallel.workers={args.workers}", f"train.epochs={args.epochs}",
                    f"train.steps={args.steps}"] + args.set_all + MODES[m][0]
            r, elapsed = run_krab("compression", krab, job, os.path.join(tmp, f"{m}.json"), sets)
            results[m] = r
            print(f"  {m:<10} test accuracy {r['test_accuracy']:.4f}  bytes {r['bytes_sent_steps']:>13,}"
                  f"  {r['samples_per_sec']:7.0f} samples/s  ({elapsed:.0f} s)", flush=True)

    base = results["sync"]
    print()
    print("| mode | krab settings | traffic / sync | bound | test accuracy | Δ vs sync |"
          " samples/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ok = True
    for m in modes:
        r = results[m]
        ratio = r["bytes_sent_steps"] / base["bytes_sent_steps"]
        bound = MODES[m][1]
        delta = r["test_accuracy"] - base["test_accuracy"]
        within = (bound is None or ratio <= bound) and delta >= -0.01
        ok &= within
        settings = ", ".join(s.split("=", 1)[0].split(".")[-1] + "=" + s.split("=", 1)[1]
                             for s in MODES[m][0]) or "—"
        print(f"| {m} | {settings} | {100 * ratio:.2f}% | "
              f"{'—' if bound is None else f'{100 * bound:.0f}%'} | {r['test_accuracy']:.4f} | "
              f"{100 * delta:+.2f} pt{'' if within else ' ✗'} | {r['samples_per_sec']:.0f} |")
    print(f"\nall modes within their traffic bound and no more than 1 point below sync: {'yes' if ok else 'NO'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
