#!/usr/bin/python3
"""Throughput: krab vs PyTorch DDP, same CNN, same Fashion-MNIST batches, same settings.

What it measures: training samples/s after warm-up (krab's report field `samples_per_sec`; the
same quantity in bench/ddp_peer.py) for 1 and 2 workers, per-worker batch 64, 1 intra-op thread
per worker, SGD lr 0.05 momentum 0.9, constant rate, S steps (default 300). The runs alternate
(krab 1 worker, DDP 1 worker, krab 2 workers, DDP 2 workers, repeated R times, default 2), so
load from other processes hits both sides alike; the table shows medians, the ratio krab/DDP,
and the scaling 2 workers / 1 worker of each.

Run from the repository root, with Debian's python (the one that has torch):
  /usr/bin/python3 bench/throughput.py                      # 300 steps, 2 repeats
  /usr/bin/python3 bench/throughput.py --steps 20 --repeats 1   # quick check
Options: --workers 1,2  --krab build/bin/krab  --json FILE (all runs, raw)
  --openblas-threads N: export OPENBLAS_NUM_THREADS=N to both krab and DDP (default 1, what
  krab's launcher sets for train.threads_per_worker: 1; torch.set_num_threads does not limit
  Debian's pthread OpenBLAS, which otherwise keeps one extra, spinning thread per process).
  0 leaves the caller's environment as it is.
It copies the krab binary to a temporary directory first, so a rebuild during the benchmark
does not swap it mid-run. Exit status 1 if any run fails. Nothing is downloaded; everything runs
on 127.0.0.1.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from common import REPO, krab_warmup, machine_load, run_ddp as run_peer, run_krab as run_krab_job, write_cnn_job


def run_krab(krab, tmp, workers, steps, tag, env):
    r, elapsed = run_krab_job("throughput", krab, os.path.join(tmp, "job.yaml"),
                              os.path.join(tmp, f"krab-{tag}.json"),
                              [f"parallel.workers={workers}", f"train.steps={steps}"], env)
    return {"samples_per_sec": r["samples_per_sec"], "final_loss": r["final_loss"],
            "wall_seconds": r["wall_seconds"], "process_seconds": elapsed}


def run_ddp(workers, steps, env):
    r, elapsed = run_peer("throughput", ["--workers", workers, "--steps", steps,
                                         "--warmup-steps", krab_warmup(steps), "--optimizer",
                                         "sgd", "--lr", "0.05", "--momentum", "0.9"], env)
    return {"samples_per_sec": r["samples_per_sec"], "final_loss": r["final_loss"],
            "wall_seconds": r["wall_seconds"], "process_seconds": elapsed}


def main():
    p = argparse.ArgumentParser(description="krab vs PyTorch DDP throughput (samples/s)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    p.add_argument("--openblas-threads", type=int,
                   default=1,
                   help="set OPENBLAS_NUM_THREADS for both krab and DDP (default 1, as krab's "
                        "launcher does; 0 = inherit)")
    args = p.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"throughput: {args.krab} is not an executable; build krab first")

    env = dict(os.environ)
    if args.openblas_threads:
        env["OPENBLAS_NUM_THREADS"] = str(args.openblas_threads)
    runs = []
    with tempfile.TemporaryDirectory(prefix="krab-bench-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(args.krab, krab)  # a snapshot: the other build may replace build/bin/krab
        write_cnn_job(os.path.join(tmp, "job.yaml"), "bench-throughput", os.path.join(tmp, "ckpt"))
        print(f"throughput: {args.steps} steps, batch 64 per worker, 1 thread per worker, "
              f"SGD lr 0.05 momentum 0.9, workers {worker_counts}, {args.repeats} repeat(s); "
              f"{os.cpu_count()} CPUs, OPENBLAS_NUM_THREADS="
              f"{env.get('OPENBLAS_NUM_THREADS', '(unset)')}", flush=True)
        print(f"{'run':>3} {'peer':<5} {'W':>2} {'samples/s':>10} {'final_loss':>10} "
              f"{'load1':>5} {'compilers':>9}", flush=True)
        for rep in range(args.repeats):
            for w in worker_counts:
                for peer in ("krab", "ddp"):
                    load, busy = machine_load()
                    if peer == "krab":
                        r = run_krab(krab, tmp, w, args.steps, f"{rep}-{w}", env)
                    else:
                        r = run_ddp(w, args.steps, env)
                    r.update({"peer": peer, "workers": w, "repeat": rep, "load1": load,
                              "compilers_running": busy})
                    runs.append(r)
                    print(f"{rep:>3} {peer:<5} {w:>2} {r['samples_per_sec']:>10.0f} "
                          f"{r['final_loss']:>10.4f} {load:>5.2f} {busy:>9}", flush=True)

    def med(peer, w):
        return statistics.median(r["samples_per_sec"] for r in runs
                                 if r["peer"] == peer and r["workers"] == w)

    print()
    print("| workers | krab samples/s (median) | DDP samples/s (median) | krab / DDP |")
    print("|--------:|------------------------:|-----------------------:|-----------:|")
    for w in worker_counts:
        k, d = med("krab", w), med("ddp", w)
        print(f"| {w} | {k:.0f} | {d:.0f} | {k / d:.2f} |")
    if len(worker_counts) > 1:
        w0, w1 = worker_counts[0], worker_counts[-1]
        print()
        print(f"scaling {w1} workers / {w0} worker(s): "
              f"krab {med('krab', w1) / med('krab', w0):.2f}, "
              f"DDP {med('ddp', w1) / med('ddp', w0):.2f}")
    pairs = []
    for w in worker_counts:
        for rep in range(args.repeats):
            k = [r for r in runs if r["peer"] == "krab" and r["workers"] == w and r["repeat"] == rep]
            d = [r for r in runs if r["peer"] == "ddp" and r["workers"] == w and r["repeat"] == rep]
            pairs.append(f"W={w}#{rep}: {k[0]['samples_per_sec'] / d[0]['samples_per_sec']:.2f}")
    print("krab / DDP of each back-to-back pair: " + ", ".join(pairs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "repeats": args.repeats, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
