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


# A job file's relative paths are relative to its own folder (docs/config.md), and these jobs
# are written into temporary folders: every path they hold is made absolute here.
def write_cnn_job(path, name, ckpt):
    with open(path, "w") as f:
        f.write(CNN_JOB.format(name=name, ckpt=os.path.abspath(ckpt)))
    return path


# krab's gpt (model.* defaults: 2 layers, width 128, 4 heads, context 64; 470,528 parameters)
# on a text corpus (write_text_corpus), batch 64 windows per worker, 2% of the windows held out
# (the last ones: about 111k next-byte predictions, so that an evaluation stays short), Adam
# at a constant 0.01: bench/ddp_peer.py --model gpt with GPT_PEER_ARGS is the same run.
GPT_TEST_FRACTION = 0.02
GPT_CONTEXT = 64
GPT_JOB = """\
name: {name}
model: {{name: gpt, layers: 2, width: 128, heads: 4, context: %d}}
data: {{name: text, path: {corpus}, batch_size: 64, test_fraction: %g}}
train:
  threads_per_worker: 1
  seed: 0
  optimizer: {{name: adam, lr: 0.01}}
  lr_schedule: constant
checkpoint: {{dir: {ckpt}}}
""" % (GPT_CONTEXT, GPT_TEST_FRACTION)
GPT_PEER_ARGS = ["--model", "gpt", "--layers", "2", "--width", "128", "--heads", "4",
                 "--context", str(GPT_CONTEXT), "--batch-size", "64",
                 "--test-fraction", str(GPT_TEST_FRACTION),
                 "--optimizer", "adam", "--lr", "0.01", "--seed", "0"]  # + --data CORPUS


def write_gpt_job(path, name, ckpt, corpus):
    with open(path, "w") as f:
        f.write(GPT_JOB.format(name=name, ckpt=os.path.abspath(ckpt),
                               corpus=os.path.abspath(corpus)))
    return path


# The text corpus of the GPT benchmarks: every .py file of Debian's libpython3.11-stdlib (the
# Python standard library; python3-torch, which scripts/setup.sh installs, depends on it), in
# byte-wise sorted path order, concatenated: 5,572,209 bytes with version 3.11.2-6+deb12u6, the
# same bytes on every machine with that package version. Nothing is downloaded.
TEXT_PACKAGE = "libpython3.11-stdlib"


def write_text_corpus(path):
    """Writes the corpus to `path`; returns (bytes, files, package version)."""
    files = subprocess.run(["dpkg-query", "-L", TEXT_PACKAGE], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    files = sorted((f for f in files if f.endswith(".py") and os.path.isfile(f)),
                   key=lambda f: f.encode())
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", TEXT_PACKAGE],
                             capture_output=True, text=True, check=True).stdout.strip()
    if not files:
        sys.exit(f"no .py files in {TEXT_PACKAGE}: is python3 installed?")
    n = 0
    with open(path, "wb") as out:
        for f in files:
            with open(f, "rb") as src:
                data = src.read()
            out.write(data)
            n += len(data)
    return n, len(files), version


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
