#!/usr/bin/python3
"""Own-model speed: krab's CNN written in Python and scripted, trained by krab, beside krab's
built-in `cnn` and beside PyTorch DDP training the same Python module (issue 19, item 3).

What it measures: training samples/s after warm-up (krab's report field `samples_per_sec`, the
same quantity in bench/ddp_peer.py) of the same job, Fashion-MNIST from the built-in source,
per-worker batch 64, 1 intra-op thread per worker, SGD lr 0.05 momentum 0.9, constant rate,
S steps (default 300), W workers (default 2), for
  builtin   krab, model: {name: cnn}
  scripted  krab, model: {name: torchscript, path: cnn.pt}, where cnn.pt is
            torch.jit.script(Cnn()) of bench/ddp_peer.py's Cnn (krab's cnn layer by layer;
            the parameter counts of Python, the built-in and the scripted run are checked equal)
  ddp       PyTorch DDP (Gloo) training that Cnn, the un-scripted nn.Module, as a DDP user would
  ddp-scripted  (with --ddp-scripted) DDP training cnn.pt itself.
The runs alternate (builtin, scripted, ddp[, ddp-scripted], repeated R times, default 3), so
load from other processes hits each side alike; the table shows the median and the spread
(min–max) of each, and the goals: scripted / builtin >= 0.95 and scripted / ddp >= 1.0, with
PASS or MISS (a missed goal is reported, not an error). The weights in cnn.pt are drawn after
torch.manual_seed(seed), as LibTorch draws the built-in cnn's, so all runs start from the same
parameters and their final losses should agree closely.

Run from the repository root, with Debian's python (the one that has torch):
  /usr/bin/python3 bench/own_model_speed.py                       # 300 steps, 3 repeats
  /usr/bin/python3 bench/own_model_speed.py --steps 20 --repeats 1    # quick check
Options: --workers 2  --krab build/bin/krab  --ddp-scripted  --json FILE (all runs, raw)
  --openblas-threads N (default 1; see bench/throughput.py).
It copies the krab binary to a temporary directory first, so a rebuild during the benchmark
does not swap it mid-run. Exit status 1 if any run fails or the parameter counts differ.
Nothing is downloaded; everything runs on 127.0.0.1.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile

import torch

from common import CNN_JOB, REPO, krab_warmup, machine_load, run_ddp, run_krab
from ddp_peer import Cnn

GOALS = (("scripted", "builtin", 0.95), ("scripted", "ddp", 1.0))
NAMES = {"builtin": "krab, built-in cnn", "scripted": "krab, TorchScript cnn.pt",
         "ddp": "PyTorch DDP, nn.Module", "ddp-scripted": "PyTorch DDP, cnn.pt"}


def script_cnn(path, seed):
    """Saves torch.jit.script(Cnn()) to `path`; returns its parameter count."""
    torch.manual_seed(seed)
    model = Cnn()
    torch.jit.script(model).save(path)
    return sum(p.numel() for p in model.parameters())


def write_job(path, model_line, ckpt):
    text = CNN_JOB.format(name="bench-own-model", ckpt=ckpt)
    if "model: {name: cnn}\n" not in text:
        sys.exit("own_model_speed: common.CNN_JOB no longer has 'model: {name: cnn}'")
    with open(path, "w") as f:
        f.write(text.replace("model: {name: cnn}\n", model_line + "\n"))
    return path


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(peer, krab, tmp, args, tag, env):
    cpu0 = children_cpu_seconds()
    if peer in ("builtin", "scripted"):
        r, elapsed = run_krab("own_model_speed", krab, os.path.join(tmp, f"{peer}.yaml"),
                              os.path.join(tmp, f"{peer}-{tag}.json"),
                              [f"parallel.workers={args.workers}", f"train.steps={args.steps}"],
                              env)
        params = r["gradient_bytes"] // 4  # float32 gradients, one per parameter
    else:
        extra = ["--scripted", os.path.join(tmp, "cnn.pt")] if peer == "ddp-scripted" else []
        r, elapsed = run_ddp("own_model_speed",
                             extra + ["--workers", args.workers, "--steps", args.steps,
                                      "--warmup-steps", krab_warmup(args.steps),
                                      "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
                             env)
        params = r["parameters"]
    return {"samples_per_sec": r["samples_per_sec"], "final_loss": r["final_loss"],
            "parameters": params, "wall_seconds": r["wall_seconds"],
            "process_seconds": elapsed, "cpu_seconds": children_cpu_seconds() - cpu0}


def cpu_model():
    with open("/proc/cpuinfo") as f:
        name = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    return f"{os.cpu_count()} x {name}"


def summarise(runs, peers, python_params):
    """Prints the table of medians and the goals; returns False if the parameter counts differ."""
    def rates(peer):
        return [r["samples_per_sec"] for r in runs if r["peer"] == peer]

    med = {p: statistics.median(rates(p)) for p in peers}
    print()
    print("| run | samples/s (median) | spread (min–max) | CPU s (median) | final loss (median) "
          "| parameters |")
    print("|-----|-------------------:|-----------------:|---------------:|--------------------:"
          "|-----------:|")
    counts = {}
    for p in peers:
        rs = [r for r in runs if r["peer"] == p]
        counts[p] = {r["parameters"] for r in rs}
        loss = statistics.median(r["final_loss"] for r in rs)
        cpu = statistics.median(r["cpu_seconds"] for r in rs)
        print(f"| {NAMES[p]} | {med[p]:,.0f} | {min(rates(p)):,.0f}–{max(rates(p)):,.0f} | "
              f"{cpu:.1f} | {loss:.6f} | {', '.join(f'{c:,}' for c in sorted(counts[p]))} |")
    print()
    print("| goal | ratio of medians | each repeat | target | result |")
    print("|------|-----------------:|------------:|-------:|--------|")
    repeats = max(r["repeat"] for r in runs) + 1
    for a, b, target in GOALS:
        ratio = med[a] / med[b]
        each = ", ".join(f"{rates(a)[i] / rates(b)[i]:.2f}" for i in range(repeats))
        print(f"| {a} / {b} | {ratio:.3f} | {each} | >= {target:g} | "
              f"{'PASS' if ratio >= target else 'MISS'} |")
    cpu = {p: statistics.median(r["cpu_seconds"] for r in runs if r["peer"] == p) for p in peers}
    print(f"\nCPU seconds of a whole run (all processes, start-up included; less sensitive to "
          f"other load than samples/s): builtin / scripted {cpu['builtin'] / cpu['scripted']:.3f}")
    same = all(c == {python_params} for c in counts.values())
    print(f"\nparameters: Python nn.Module {python_params:,}; "
          + ", ".join(f"{p} {', '.join(f'{c:,}' for c in sorted(counts[p]))}" for p in peers)
          + (" (equal)" if same else " -- DIFFERENT"))
    return same


def main():
    p = argparse.ArgumentParser(description="krab TorchScript CNN vs built-in cnn vs PyTorch DDP "
                                            "(samples/s)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="train.seed; also cnn.pt's weights")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--ddp-scripted", action="store_true",
                   help="also run DDP on the scripted module")
    p.add_argument("--json", help="write every run's numbers to this file")
    p.add_argument("--openblas-threads", type=int, default=1,
                   help="set OPENBLAS_NUM_THREADS for krab and DDP (default 1; 0 = inherit)")
    args = p.parse_args()
    if args.steps < 2 or args.repeats < 1 or args.workers < 1:
        p.error("--steps >= 2, --repeats >= 1 and --workers >= 1")
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"own_model_speed: {args.krab} is not an executable; build krab first")
    env = dict(os.environ)
    if args.openblas_threads:
        env["OPENBLAS_NUM_THREADS"] = str(args.openblas_threads)
    peers = ["builtin", "scripted", "ddp"] + (["ddp-scripted"] if args.ddp_scripted else [])
    runs = []
    with tempfile.TemporaryDirectory(prefix="krab-bench-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(args.krab, krab)  # a snapshot: another build may replace build/bin/krab
        python_params = script_cnn(os.path.join(tmp, "cnn.pt"), args.seed)
        ckpt = os.path.join(tmp, "ckpt")
        write_job(os.path.join(tmp, "builtin.yaml"), "model: {name: cnn}", ckpt)
        write_job(os.path.join(tmp, "scripted.yaml"),
                  f"model: {{name: torchscript, path: {os.path.join(tmp, 'cnn.pt')}}}", ckpt)
        print(f"own_model_speed: {args.steps} steps, {args.workers} workers, batch 64 per "
              f"worker, 1 thread per worker, SGD lr 0.05 momentum 0.9, {args.repeats} "
              f"repeat(s); CPU: {cpu_model()}; torch {torch.__version__}; "
              f"OPENBLAS_NUM_THREADS={env.get('OPENBLAS_NUM_THREADS', '(unset)')}", flush=True)
        print(f"{'run':>3} {'peer':<12} {'samples/s':>10} {'CPU s':>6} {'final_loss':>10} "
              f"{'load1':>5} {'compilers':>9}", flush=True)
        for rep in range(args.repeats):
            for peer in peers:
                load, busy = machine_load()
                r = run_one(peer, krab, tmp, args, rep, env)
                r.update({"peer": peer, "repeat": rep, "load1": load, "compilers_running": busy})
                runs.append(r)
                print(f"{rep:>3} {peer:<12} {r['samples_per_sec']:>10.0f} "
                      f"{r['cpu_seconds']:>6.1f} {r['final_loss']:>10.6f} {load:>5.2f} {busy:>9}",
                      flush=True)
    same = summarise(runs, peers, python_params)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "workers": args.workers, "repeats": args.repeats,
                       "cpu": cpu_model(), "python_parameters": python_params, "runs": runs},
                      f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
