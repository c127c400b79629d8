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
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(REPO, "bench", "ddp_peer.py")
JOB = os.path.join(REPO, "examples", "fashion_cnn.yaml")
PYTHON = "/usr/bin/python3"

SETTINGS = {
    "adam-cosine": {"krab": [],  # the job file's own optimizer and schedule
                    "ddp": ["--optimizer", "adam", "--lr", "0.003", "--cosine"]},
    "sgd-constant": {"krab": ["--set", "train.optimizer.name=sgd",
                              "--set", "train.optimizer.lr=0.05",
                              "--set", "train.optimizer.momentum=0.9",
                              "--set", "train.lr_schedule=constant"],
                     "ddp": ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]},
}


def fail(cmd, proc):
    sys.stderr.write(f"accuracy: {' '.join(cmd)} failed with exit status {proc.returncode}\n")
    sys.stderr.write("--- stdout (tail) ---\n" + proc.stdout[-3000:] + "\n")
    sys.stderr.write("--- stderr (tail) ---\n" + proc.stderr[-3000:] + "\n")
    sys.exit(1)


def run_krab(krab, tmp, name, args):
    report = os.path.join(tmp, f"krab-{name}.json")
    cmd = [krab, "train", JOB, "--set", f"parallel.workers={args.workers}",
           "--set", f"train.epochs={args.epochs}", "--set", "train.threads_per_worker=1",
           "--set", f"checkpoint.dir={os.path.join(tmp, 'ckpt-' + name)}",
           "--report", report] + SETTINGS[name]["krab"]
    if args.steps > 0:
        cmd += ["--set", f"train.steps={args.steps}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(report):
        fail(cmd, proc)
    with open(report) as f:
        r = json.load(f)
    return {"test_accuracy": r["test_accuracy"], "final_loss": r["final_loss"],
            "samples_per_sec": r["samples_per_sec"], "steps": r["steps"],
            "process_seconds": elapsed}


def run_ddp(name, args):
    cmd = [PYTHON, PEER, "--workers", str(args.workers), "--epochs", str(args.epochs),
           "--eval"] + SETTINGS[name]["ddp"]
    if args.steps > 0:
        cmd += ["--steps", str(args.steps), "--warmup-steps", str(min(10, max(1, args.steps // 10)))]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        fail(cmd, proc)
    r = json.loads(lines[-1])
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
