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
  /usr/bin/python3 bench/compression.py --seeds 0,1,2,3,4 --json r.json  # every seed (below)
Options: --workers 4  --epochs 2  --json FILE (all reports)  --krab build/bin/krab
  --seeds S,S,... runs sync and every mode at each train.seed and reports, per mode, the
      difference from sync of the same seed at every seed (PASS/MISS against 1 point), its
      mean, min and max: the accuracy promise is per seed, not on average. Without it one run
      per mode at the job's seed (0), as before. With --json the reports ({seed: {mode:
      report}}) are written after every run; --resume keeps the runs the file already holds
      (an interrupted sweep goes on; a later --modes reuses the sync runs; it does not check
      that they ran with the same settings), --table-only prints the table of what FILE holds
      and runs nothing.
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


def parse_args():
    p = argparse.ArgumentParser(description="krab compression / sync modes vs plain sync")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="fixed steps instead of epochs")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seeds", help="comma-separated train.seed values, e.g. 0,1,2,3,4: every "
                   "mode and sync at each, then mean/min/max of the difference per mode")
    p.add_argument("--resume", action="store_true",
                   help="with --seeds and --json: keep the runs FILE already holds")
    p.add_argument("--table-only", action="store_true",
                   help="with --seeds and --json: the table of the runs FILE holds, nothing run")
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
    args.modes = args.modes.split(",")
    for m in args.modes:
        if m not in MODES:
            sys.exit(f"compression: unknown mode '{m}' (choose from {', '.join(MODES)})")
    if "sync" not in args.modes:
        args.modes.insert(0, "sync")
    if args.seeds is not None:
        try:
            args.seeds = [int(x) for x in args.seeds.split(",")]
        except ValueError:
            sys.exit(f"compression: --seeds wants integers separated by commas, got '{args.seeds}'")
    if (args.resume or args.table_only) and (args.seeds is None or not args.json):
        sys.exit("compression: --resume and --table-only need --seeds and --json")
    if not args.table_only and not os.access(args.krab, os.X_OK):
        sys.exit(f"compression: {args.krab} is not an executable; build krab first")
    return args


def settings_of(m):
    return ", ".join(s.split("=", 1)[0].split(".")[-1] + "=" + s.split("=", 1)[1]
                     for s in MODES[m][0]) or "—"


def run_mode(args, krab, job, tmp, m, seed_set):
    sets = [f"parallel.workers={args.workers}", f"train.epochs={args.epochs}",
            f"train.steps={args.steps}"] + args.set_all + seed_set + MODES[m][0]
    r, elapsed = run_krab("compression", krab, job, os.path.join(tmp, f"{m}.json"), sets)
    print(f"  {m:<10} test accuracy {r['test_accuracy']:.4f}  bytes {r['bytes_sent_steps']:>13,}"
          f"  {r['samples_per_sec']:7.0f} samples/s  ({elapsed:.0f} s)", flush=True)
    return r


def one_seed_table(args, results):
    """The table of one invocation without --seeds (the behaviour from before --seeds)."""
    base = results["sync"]
    print()
    print("| mode | krab settings | traffic / sync | bound | test accuracy | Δ vs sync |"
          " samples/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ok = True
    for m in args.modes:
        r = results[m]
        ratio = r["bytes_sent_steps"] / base["bytes_sent_steps"]
        bound = MODES[m][1]
        delta = r["test_accuracy"] - base["test_accuracy"]
        within = (bound is None or ratio <= bound) and delta >= -0.01
        ok &= within
        print(f"| {m} | {settings_of(m)} | {100 * ratio:.2f}% | "
              f"{'—' if bound is None else f'{100 * bound:.0f}%'} | {r['test_accuracy']:.4f} | "
              f"{100 * delta:+.2f} pt{'' if within else ' ✗'} | {r['samples_per_sec']:.0f} |")
    print(f"\nall modes within their traffic bound and no more than 1 point below sync: {'yes' if ok else 'NO'}")
    return results


def seeds_table(args, results):
    """Per mode: the difference from sync of the same seed at every seed, its mean, min and max,
    and PASS/MISS per seed against 1 point: the promise holds at every seed, not on average."""
    seeds = [s for s in args.seeds if "sync" in results.get(str(s), {})]
    print()
    print("| mode | krab settings | traffic / sync | bound | "
          + " | ".join(f"seed {s}" for s in seeds) + " | mean Δ | min Δ | max Δ | every seed |")
    print("|---|---|---:|---:|" + "---:|" * len(seeds) + "---:|---:|---:|---|")
    ok = True
    for m in args.modes:
        done = [s for s in seeds if m in results[str(s)]]
        if not done:
            continue
        ratios, deltas, cells = [], [], []
        for s in seeds:
            per = results[str(s)]
            if m not in per:
                cells.append("—")
                continue
            ratios.append(per[m]["bytes_sent_steps"] / per["sync"]["bytes_sent_steps"])
            if m == "sync":
                cells.append(f"{per[m]['test_accuracy']:.4f}")
                continue
            d = 100 * (per[m]["test_accuracy"] - per["sync"]["test_accuracy"])
            deltas.append(d)
            cells.append(f"{d:+.2f} {'PASS' if d >= -1.0 else 'MISS'}")
        bound = MODES[m][1]
        ratio = max(ratios)
        within = (bound is None or ratio <= bound) and all(d >= -1.0 for d in deltas)
        ok &= within
        stats = (f"{sum(deltas) / len(deltas):+.2f} | {min(deltas):+.2f} | {max(deltas):+.2f}"
                 if deltas else "— | — | —")
        verdict = "—" if m == "sync" else ("yes" if within else "NO")
        print(f"| {m} | {settings_of(m)} | {100 * ratio:.2f}% | "
              f"{'—' if bound is None else f'{100 * bound:.0f}%'} | " + " | ".join(cells)
              + f" | {stats} | {verdict} ({len(done)} of {len(args.seeds)} seeds) |")
    print(f"\nevery mode within its traffic bound and no more than 1 point below sync at every "
          f"seed: {'yes' if ok else 'NO'}")


def run_seeds(args, krab, job, tmp):
    """Every mode at every seed; the reports go to --json after each run, so an interrupted
    sweep keeps what finished and --resume goes on from there."""
    results = {}
    if args.resume and os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)
    for seed in args.seeds:
        per = results.setdefault(str(seed), {})
        print(f" seed {seed}", flush=True)
        for m in args.modes:
            if m in per:
                print(f"  {m:<10} kept from {args.json}", flush=True)
                continue
            per[m] = run_mode(args, krab, job, tmp, m, [f"train.seed={seed}"])
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    return results


def main():
    args = parse_args()
    if args.table_only:
        with open(args.json) as f:
            seeds_table(args, json.load(f))
        return
    length = f"{args.steps} steps" if args.steps else f"{args.epochs} epochs"
    print(f"compression: {args.workers} workers x batch 64, CNN, {length}, SGD 0.05/0.9, "
          f"1 thread per worker" + "".join(f", {kv}" for kv in args.set_all)
          + (f", seeds {','.join(map(str, args.seeds))}" if args.seeds is not None else ""),
          flush=True)
    with tempfile.TemporaryDirectory(prefix="krab-compression-") as tmp:
        krab = shutil.copy(args.krab, os.path.join(tmp, "krab"))
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "compression", os.path.join(tmp, "ck"))
        if args.seeds is not None:
            results = run_seeds(args, krab, job, tmp)
        else:
            results = {m: run_mode(args, krab, job, tmp, m, []) for m in args.modes}
    if args.seeds is not None:
        seeds_table(args, results)
    else:
        one_seed_table(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
