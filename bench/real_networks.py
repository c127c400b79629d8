#!/usr/bin/python3
"""Real networks: torchvision's ResNet-18 and MobileNetV2, scripted from Python and trained by
krab, beside PyTorch DDP training the same nn.Module, out of the box and with krab's heap
settings (issue 25, item 1).

What it measures, for each network: training samples/s after warm-up (krab's report field
`samples_per_sec`; bench/ddp_peer.py measures the same quantity) and CPU seconds per training
step of all the run's processes together, for
  krab        krab train, model: {name: torchscript, path: NET.pt}, where NET.pt is
              torch.jit.script(torchvision.models.NET(num_classes=10)) of a module built after
              torch.manual_seed(seed): random initialisation, nothing downloaded;
  ddp         PyTorch DDP (Gloo) training that nn.Module (not scripted), built the same way,
              so both start from the same parameters (bench/ddp_peer.py --torchvision NET),
              in the environment a user runs it in: glibc's default heap;
  ddp-heap    the same DDP run with GLIBC_TUNABLES set to what krab's processes do with mallopt
              (src/cli/main.cpp: M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB): like for like;
  krab-glibc  (unless --no-krab-glibc) krab with glibc's default heap: a GLIBC_TUNABLES that
              names a malloc tunable (glibc.malloc.perturb=0, its default) makes krab leave the
              heap alone, so krab-glibc / ddp is krab's lead without the allocator.
Same job on every side: a synthetic 10-class set of 3x32x32 float32 images that can be learnt
(a faint fixed smooth pattern per class under noise), written by this script as a `tensors` file
(docs/data.md) that krab reads and DDP loads; the same examples in the same order (ddp_peer.py
re-implements krab's sampler); 2 workers x 32 (--workers, --batch-size), one intra-op thread
per worker, OPENBLAS_NUM_THREADS=1, Adam lr 0.001 at a constant rate, cross-entropy, S steps
(default 40; krab's warm-up of min(10, S/10) steps is left out of samples/s on both sides).
BatchNorm's buffers are broadcast from rank 0 on both sides (DDP's broadcast_buffers default,
krab's parallel.broadcast_buffers default).

CPU seconds per step: the children's user + system seconds (getrusage) of a run of S steps
minus those of a run of --short-steps (default 8) steps of the same configuration, divided by
the difference in steps, so that start-up (Python's imports, loading the script, writing the
checkpoint) cancels out. Other load disturbs it less than samples/s.

The configurations alternate (krab, ddp, ddp-heap, krab-glibc, per network, repeated R times,
default 3), so load from other processes hits each alike; the tables give the median and the
spread (min-max) of each, the ratios of medians with each repeat's ratio, and the goal of
issue 25, krab / ddp-heap >= 1.0 (like for like), with PASS or MISS (a missed goal is reported,
not an error). The header line names the CPU; every run line has the 1-minute load average and
the compilers running at its start.

Run from the repository root with Debian's python (python3-torch, python3-torchvision):
  /usr/bin/python3 bench/real_networks.py            # about 5 min on 2 idle cores (4 repeats: 7 min at load 2-6)
  /usr/bin/python3 bench/real_networks.py --steps 20 --repeats 1 --short-steps 5   # quick check
Options: --nets resnet18,mobilenet_v2  --workers 2  --batch-size 32  --lr 0.001
  --krab build/bin/krab  --no-krab-glibc  --json FILE (all runs, raw).
It copies the krab binary to a temporary directory first, so a rebuild during the benchmark
does not swap it mid-run. Exit status 1 if any run fails or the parameter counts of Python,
krab and DDP differ. Nothing is downloaded; everything runs on 127.0.0.1.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

import torch
import torchvision

from common import REPO, krab_warmup, machine_load, run_ddp, run_krab
from own_model_speed import children_cpu_seconds, cpu_model

# src/cli/main.cpp's keep_freed_memory(), as tunables: the same two settings, which (as
# mallopt does) also switch off glibc's dynamic mmap threshold.
KRAB_HEAP = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
GLIBC_DEFAULT = "glibc.malloc.perturb=0"  # a malloc tunable at its default: krab skips mallopt
PEERS = {"krab": "krab, TorchScript", "ddp": "DDP, out of the box",
         "ddp-heap": "DDP, krab's heap settings", "krab-glibc": "krab, glibc's default heap"}
HEAP = {"krab": None, "ddp": None, "ddp-heap": KRAB_HEAP, "krab-glibc": GLIBC_DEFAULT}
RATIOS = (("krab", "ddp", "out of the box", None), ("krab", "ddp-heap", "like for like", 1.0),
          ("krab-glibc", "ddp", "both on glibc's default heap", None),
          ("krab", "krab-glibc", "krab's heap settings, krab alone", None))
CLASSES, EXAMPLES, SIDE = 10, 4096, 32

JOB = """\
name: bench-real-networks
model: {{name: torchscript, path: {model}}}
data: {{name: tensors, path: {data}, batch_size: {batch}}}
train:
  threads_per_worker: 1
  seed: {seed}
  optimizer: {{name: adam, lr: {lr}}}
  lr_schedule: constant
checkpoint: {{dir: {ckpt}}}
"""


def cpu_description():
    """cpu_model() with the clock and whether it has AVX-512 (oneDNN's kernels differ)."""
    with open("/proc/cpuinfo") as f:
        info = f.read()
    mhz = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("cpu MHz")),
               "?")
    avx512 = "yes" if " avx512f" in info else "no"
    return f"{cpu_model()}, {float(mhz) / 1000:.1f} GHz, AVX-512 {avx512}"


def write_data(path, seed):
    """A learnable set: class k is a fixed smooth pattern (3x4x4 noise upsampled to 32x32,
    scaled by 0.15) plus pixel noise of standard deviation 1, faint enough that ResNet-18 needs
    tens of steps to separate them (one process, batch 64, Adam 0.001: loss 2.0 after 10 steps,
    0.4 after 30, 0.1-0.2 after 50-60). Labels cycle through the classes; the sampler
    shuffles."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.nn.functional.interpolate(torch.randn(CLASSES, 3, 4, 4, generator=g),
                                               size=(SIDE, SIDE), mode="bilinear",
                                               align_corners=False)
    y = torch.arange(EXAMPLES) % CLASSES
    x = 0.15 * patterns[y] + torch.randn(EXAMPLES, 3, SIDE, SIDE, generator=g)
    torch.save({"x": x.contiguous(), "y": y}, path)


def script_net(name, path, seed):
    """Saves torch.jit.script of torchvision's `name` (10 classes), built after
    torch.manual_seed(seed) as bench/ddp_peer.py builds it; returns its parameter count."""
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(num_classes=CLASSES)
    torch.jit.script(model).save(path)
    return sum(p.numel() for p in model.parameters())


def run_one(net, peer, steps, krab, tmp, args, tag, env):
    env = dict(env)
    env.pop("GLIBC_TUNABLES", None)
    if HEAP[peer]:
        env["GLIBC_TUNABLES"] = HEAP[peer]
    cpu0 = children_cpu_seconds()
    if peer.startswith("krab"):
        r, elapsed = run_krab("real_networks", krab, os.path.join(tmp, f"{net}.yaml"),
                              os.path.join(tmp, f"{net}-{peer}-{tag}.json"),
                              [f"parallel.workers={args.workers}", f"train.steps={steps}"], env)
        params = r["gradient_bytes"] // 4  # float32 gradients, one per parameter
    else:
        r, elapsed = run_ddp("real_networks",
                             ["--torchvision", net, "--tensors", os.path.join(tmp, "data.pt"),
                              "--workers", args.workers, "--batch-size", args.batch_size,
                              "--steps", steps, "--warmup-steps", krab_warmup(steps),
                              "--optimizer", "adam", "--lr", args.lr, "--seed", args.seed], env)
        params = r["parameters"]
    return {"samples_per_sec": r["samples_per_sec"], "final_loss": r["final_loss"],
            "parameters": params, "process_seconds": elapsed,
            "cpu_seconds": children_cpu_seconds() - cpu0}


def measure(nets, peers, krab, tmp, args, env):
    """Every run: the short ones first (for the start-up CPU), then R rounds of long ones."""
    runs = []
    print(f"{'net':<13} {'run':>5} {'peer':<11} {'steps':>5} {'samples/s':>10} {'CPU s':>6} "
          f"{'final_loss':>10} {'load1':>5} {'compilers':>9}", flush=True)
    rounds = [("short", args.short_steps)] + [(rep, args.steps) for rep in range(args.repeats)]
    for rep, steps in rounds:
        for net in nets:
            for peer in peers:
                load, busy = machine_load()
                r = run_one(net, peer, steps, krab, tmp, args, rep, env)
                r.update({"net": net, "peer": peer, "repeat": rep, "steps": steps,
                          "load1": load, "compilers_running": busy})
                runs.append(r)
                print(f"{net:<13} {rep:>5} {peer:<11} {steps:>5} {r['samples_per_sec']:>10.0f} "
                      f"{r['cpu_seconds']:>6.1f} {r['final_loss']:>10.6f} {load:>5.2f} "
                      f"{busy:>9}", flush=True)
    return runs


def per_step_cpu(runs, args):
    """Adds cpu_per_step to every long run: its CPU less the median short run's of the same
    network and configuration, over the steps between them."""
    for r in runs:
        if r["repeat"] == "short":
            continue
        short = statistics.median(s["cpu_seconds"] for s in runs if s["repeat"] == "short"
                                  and s["net"] == r["net"] and s["peer"] == r["peer"])
        r["cpu_per_step"] = (r["cpu_seconds"] - short) / (args.steps - args.short_steps)


def summarise(runs, nets, peers, python_params):
    """Prints the tables; returns False if a parameter count differs from Python's."""
    long = [r for r in runs if r["repeat"] != "short"]

    def of(net, peer, key):
        return [r[key] for r in long if r["net"] == net and r["peer"] == peer]

    print("\n| network | run | samples/s (median) | spread (min–max) | CPU s per step (median) "
          "| final loss (median) | parameters |")
    print("|---|---|---:|---:|---:|---:|---:|")
    same = True
    for net in nets:
        for p in peers:
            rate, cpu = of(net, p, "samples_per_sec"), of(net, p, "cpu_per_step")
            counts = {r["parameters"] for r in runs if r["net"] == net and r["peer"] == p}
            same &= counts == {python_params[net]}
            print(f"| {net} | {PEERS[p]} | {statistics.median(rate):,.0f} | "
                  f"{min(rate):,.0f}–{max(rate):,.0f} | {statistics.median(cpu):.3f} | "
                  f"{statistics.median(of(net, p, 'final_loss')):.4f} | "
                  f"{', '.join(f'{c:,}' for c in sorted(counts))} |")
    print("\n| network | ratio | what | samples/s, ratio of medians | each repeat "
          "| CPU s per step, ratio of medians | target | result |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for net in nets:
        for a, b, what, target in RATIOS:
            if a not in peers or b not in peers:
                continue
            ra, rb = of(net, a, "samples_per_sec"), of(net, b, "samples_per_sec")
            ratio = statistics.median(ra) / statistics.median(rb)
            cpu = (statistics.median(of(net, a, "cpu_per_step"))
                   / statistics.median(of(net, b, "cpu_per_step")))
            each = ", ".join(f"{x / y:.2f}" for x, y in zip(ra, rb))
            verdict = "—" if target is None else ("PASS" if ratio >= target else "MISS")
            print(f"| {net} | {a} / {b} | {what} | {ratio:.3f} | {each} | {cpu:.3f} | "
                  f"{'—' if target is None else f'>= {target:g}'} | {verdict} |")
    print(f"\nparameters: Python " + ", ".join(f"{n} {c:,}" for n, c in python_params.items())
          + ("; krab's and DDP's equal" if same else "; krab's or DDP's DIFFERENT"))
    return same


def main():
    p = argparse.ArgumentParser(description="torchvision networks, krab (TorchScript) vs "
                                            "PyTorch DDP out of the box and with krab's heap")
    p.add_argument("--nets", default="resnet18,mobilenet_v2",
                   help="torchvision.models names, comma-separated")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--short-steps", type=int, default=8,
                   help="steps of the run whose CPU is subtracted (start-up)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.001, help="Adam's, constant")
    p.add_argument("--seed", type=int, default=0, help="train.seed; also the weights and data")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--no-krab-glibc", action="store_true",
                   help="leave out krab on glibc's default heap")
    p.add_argument("--json", help="write every run's numbers to this file")
    args = p.parse_args()
    nets = [n for n in args.nets.split(",") if n]
    # Both runs need a step after krab's warm-up, or krab reports no samples/s.
    if not 2 <= args.short_steps < args.steps or args.repeats < 1 or args.workers < 1 \
            or args.batch_size < 1 or not nets:
        p.error("2 <= --short-steps < --steps, --repeats, --workers, --batch-size >= 1, "
                "--nets not empty")
    unknown = [n for n in nets if not callable(getattr(torchvision.models, n, None))]
    if unknown:
        p.error(f"--nets: not in torchvision.models: {', '.join(unknown)}")
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"real_networks: {args.krab} is not an executable; build krab first")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    peers = [q for q in PEERS if not (q == "krab-glibc" and args.no_krab_glibc)]
    with tempfile.TemporaryDirectory(prefix="krab-bench-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(args.krab, krab)  # a snapshot: another build may replace build/bin/krab
        write_data(os.path.join(tmp, "data.pt"), args.seed)
        python_params = {}
        for net in nets:
            python_params[net] = script_net(net, os.path.join(tmp, f"{net}.pt"), args.seed)
            with open(os.path.join(tmp, f"{net}.yaml"), "w") as f:
                f.write(JOB.format(model=os.path.join(tmp, f"{net}.pt"),
                                   data=os.path.join(tmp, "data.pt"), batch=args.batch_size,
                                   seed=args.seed, lr=args.lr, ckpt=os.path.join(tmp, "ckpt")))
        print(f"real_networks: {', '.join(nets)}; {args.steps} steps ({args.short_steps} for "
              f"start-up CPU), {args.workers} workers x {args.batch_size}, 3x32x32, 10 classes, "
              f"Adam lr {args.lr:g}, 1 thread per worker, OPENBLAS_NUM_THREADS=1, "
              f"{args.repeats} repeat(s); CPU: {cpu_description()}; torch {torch.__version__}, "
              f"torchvision {torchvision.__version__}", flush=True)
        runs = measure(nets, peers, krab, tmp, args, env)
    per_step_cpu(runs, args)
    same = summarise(runs, nets, peers, python_params)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "real_networks", "nets": nets, "steps": args.steps,
                       "short_steps": args.short_steps, "workers": args.workers,
                       "batch_size": args.batch_size, "repeats": args.repeats,
                       "cpu": cpu_description(), "network_parameters": python_params, "runs": runs},
                      f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
