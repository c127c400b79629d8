#!/usr/bin/python3
"""Accuracy: krab vs PyTorch DDP after 2 epochs on Fashion-MNIST, 4 workers, the CNN.

What it measures: test accuracy (whole 10k test split), final loss and samples/s of four runs
  krab  examples/fashion_cnn.yaml as shipped (Adam lr 0.003, cosine decay, 2 epochs)
  DDP   the same (bench/ddp_peer.py --optimizer adam --lr 0.003 --cosine)
  krab  the same job with SGD lr 0.05 momentum 0.9, constant rate
  DDP   the same
all with 4 workers x batch 64 (global batch 256, 234 steps per epoch), 1 thread per worker, seed 0.
Both sides see the same batches in the same order and start from the same parameters, so the
accuracies should agree closely (they differ only by floating-point reduction order).

Run from the repository root, with Debian's python (the one that has torch):
  /usr/bin/python3 bench/accuracy.py                 # the full benchmark (minutes per run)
  /usr/bin/python3 bench/accuracy.py --steps 20      # quick check: 20 steps instead of 2 epochs
Options: --workers 4  --epochs 2  --krab build/bin/krab  --json FILE.
krab writes its checkpoints into a temporary directory (checkpoint.dir is overridden), not runs/.
Exit status 1 if a run fails. Nothing is downloaded; everything runs on 127.0.0.1.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from common import REPO, krab_warmup, run_ddp as run_peer, run_krab as run_krab_job

JOB = os.path.join(REPO, "examples", "fashion_cnn.yaml")

SETTINGS = {
    "adam-cosine": {"krab": [],  # the job file's own optimizer and schedule
                    "ddp": ["--optimizer", "adam", "--lr", "0.003", "--cosine"]},
    "sgd-constant": {"krab": ["train.optimizer.name=sgd", "train.optimizer.lr=0.05",
                              "train.optimizer.momentum=0.9", "train.lr_schedule=constant"],
                     "ddp": ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]},
}


def run_krab(krab, tmp, name, args):
    sets = [f"parallel.workers={args.workers}", f"train.epochs={args.epochs}",
            "train.threads_per_worker=1", f"checkpoint.dir={os.path.join(tmp, 'ckpt-' + name)}"]
    sets += SETTINGS[name]["krab"]
    if args.steps > 0:
        sets.append(f"train.steps={args.steps}")
    r, elapsed = run_krab_job("accuracy", krab, JOB, os.path.join(tmp, f"krab-{name}.json"), sets)
    return {"test_accuracy": r["test_accuracy"], "final_loss": r["final_loss"],
            "samples_per_sec": r["samples_per_sec"], "steps": r["steps"],
            "process_seconds": elapsed}


def run_ddp(name, args):
    peer_args = ["--workers", args.workers, "--epochs", args.epochs, "--eval"]
    peer_args += SETTINGS[name]["ddp"]
    if args.steps > 0:
        peer_args += ["--steps", args.steps, "--warmup-steps", krab_warmup(args.steps)]
    r, elapsed = run_peer("accuracy", peer_args)
    return {"test_accuracy": r["test_accuracy"], "final_loss": r["final_loss"],
            "samples_per_sec": r["samples_per_sec"], "steps": r["steps"],
            "process_seconds": elapsed}


def main():
    p = argparse.ArgumentParser(description="krab vs PyTorch DDP test accuracy")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="> 0: run this many steps instead")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    args = p.parse_args()
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"accuracy: {args.krab} is not an executable; build krab first")

    results = {}
    with tempfile.TemporaryDirectory(prefix="krab-bench-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(args.krab, krab)  # a snapshot: the other build may replace build/bin/krab
        length = f"{args.steps} steps" if args.steps > 0 else f"{args.epochs} epochs"
        print(f"accuracy: {args.workers} workers x batch 64, {length}, 1 thread per worker, "
              f"seed 0", flush=True)
        for name in SETTINGS:
            for peer in ("krab", "ddp"):
                r = run_krab(krab, tmp, name, args) if peer == "krab" else run_ddp(name, args)
                results[(name, peer)] = r
                print(f"  {name:<13} {peer:<5} steps {r['steps']:>4}  test accuracy "
                      f"{r['test_accuracy']:.4f}  final loss {r['final_loss']:.4f}  "
                      f"{r['samples_per_sec']:.0f} samples/s  {r['process_seconds']:.0f} s",
                      flush=True)

    print()
    print("| setting | krab test acc. | DDP test acc. | krab final loss | DDP final loss |")
    print("|---------|---------------:|--------------:|----------------:|---------------:|")
    for name in SETTINGS:
        k, d = results[(name, "krab")], results[(name, "ddp")]
        print(f"| {name} | {k['test_accuracy']:.4f} | {d['test_accuracy']:.4f} | "
              f"{k['final_loss']:.4f} | {d['final_loss']:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"setting": n, "peer": p, **r} for (n, p), r in results.items()], f,
                      indent=2)


if __name__ == "__main__":
    main()
