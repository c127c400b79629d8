"""Shared pieces of the bench/ drivers: where things are, the CNN job they give krab, and how a
krab or DDP run is started, checked and read back. Not a benchmark itself."""

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(REPO, "bench", "ddp_peer.py")
PYTHON = "/usr/bin/python3"  # Debian's python3-torch; a pyenv python on PATH has no torch

# krab's cnn on Fashion-MNIST, batch 64 per worker, one thread per worker, SGD with momentum
# at a constant rate: the setting bench/ddp_peer.py reproduces by default.
CNN_JOB = """\
name: {name}
model: {{name: cnn}}
data: {{name: fashion-mnist, path: /usr/share/datasets/fashion-mnist, batch_size: 64}}
train:
  threads_per_worker: 1
  seed: 0
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
  lr_schedule: constant
checkpoint: {{dir: {ckpt}}}
"""


def write_cnn_job(path, name, ckpt):
    with open(path, "w") as f:
        f.write(CNN_JOB.format(name=name, ckpt=ckpt))
    return path


def krab_warmup(steps):
    """Steps krab leaves out of samples_per_sec (src/train/trainer.cpp)."""
    return min(10, max(1, steps // 10))


def fail(tool, cmd, proc):
    sys.stderr.write(f"{tool}: {' '.join(cmd)} failed with exit status {proc.returncode}\n")
    sys.stderr.write("--- stdout (tail) ---\n" + proc.stdout[-3000:] + "\n")
    sys.stderr.write("--- stderr (tail) ---\n" + proc.stderr[-3000:] + "\n")
    sys.exit(1)


def run_krab(tool, krab, job, report, sets, env=None):
    """Runs `krab train job --report report --set ...`; exits on failure. Returns (the report,
    the seconds the whole process took)."""
    cmd = [krab, "train", job, "--report", report]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(report):
        fail(tool, cmd, proc)
    with open(report) as f:
        return json.load(f), elapsed


def run_ddp(tool, args, env=None):
    """Runs bench/ddp_peer.py with `args`; exits on failure. Returns (its JSON line, seconds)."""
    cmd = [PYTHON, PEER] + [str(a) for a in args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        fail(tool, cmd, proc)
    return json.loads(lines[-1]), elapsed


def machine_load():
    """1-minute load average and the number of compiler processes running (the other engineer
    may be building): recorded with every run so noisy runs can be recognised."""
    load = float(open("/proc/loadavg").read().split()[0])
    busy = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                comm = open(f"/proc/{pid}/comm").read().strip()
            except OSError:
                continue
            busy += comm in ("cc1plus", "cc1", "ld", "ld.gold", "ld.lld", "ninja", "make")
    return load, busy
