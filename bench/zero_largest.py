#!/usr/bin/python3
"""ZeRO: the largest GPT that trains with 4 workers, each in its own memory cgroup.

What it measures (issue 26, "what it must show" item 2): for each run kind (krab
`parallel.zero_stage` 0, 1, 2, 3; stage 3 with model.activation_checkpointing and
train.precision bf16, and with parallel.offload disk too; PyTorch DDP) the largest GPT of a
fixed ladder of sizes (layers x width, parameters in closed form) that trains: a real 20-step run
(`train.steps: 20`, Adam lr 1e-3, batch 2 windows of 32 bytes per worker: the question is memory,
not speed) that exits 0 with the mean loss of its last 5 steps below that of its first 5. Each
worker is capped by a cgroup v1 memory group of its own (--cap-gib, default 5 GiB): krab runs as
4 single-worker "nodes" (`--nnodes 4 --node-rank R --nproc-per-node 1` on 127.0.0.1), so each
cgroup holds one launcher and its one worker and the launcher's memory check sees the cap as its
budget; DDP runs as 4 processes of bench/ddp_peer.py's multi-host mode (its GPT is krab's: same
modules, parameter order and initialisation). A size that does not fit ends one of three ways,
each named in the table: "refused" (krab's launcher predicted it does not fit and exited 2
before building anything: its one line is kept), "OOM" (the kernel's OOM killer ended a process
of a cgroup: memory.oom_control's oom_kill count, exit 137 or a worker killed by signal 9; "in
preflight" when it was the launcher, before it started its worker), or "timeout". Anything else
(another error, a loss that does not go down) is a failure of the bench or of krab: shown, and
the exit status is 1. Stage 3 is refused by krab builds without it (exit 2, "not built yet"):
its rows then say "not built", and the same command measures it once it is built.

Search: per run kind, start at the ladder rung a rough bytes-per-parameter estimate says fits
(ESTIMATE below), go up until a size does not fit, or down until one does; the table gives the
largest that trained, the first size above it that did not and how, and the largest's peak
memory: the cgroup's max usage (launcher + worker + page cache of the cgroup; memory.max_usage_
in_bytes) and, for krab, the worker's VmHWM and model-state bytes from the report's `memory`.
The parameter count of each rung is the closed form of krab's gpt (gpt_parameters); a stage-0
run checks it against the report (parameters bytes = 4 x count).

Load: memory numbers do not depend on the machine's load (other processes slow the runs down,
they do not change what a run allocates), but the caps must fit in what is free: the script
refuses to start when MemAvailable < workers x cap + 1 GiB. Needs root (cgroups); creates its
cgroups under /sys/fs/cgroup/memory/krab-zero-largest-PID-*, one per worker per run, and removes
them on every exit (the processes in them are ended first).

Run from the repository root with Debian's python, as root:
  /usr/bin/python3 bench/zero_largest.py               # every run kind
  /usr/bin/python3 bench/zero_largest.py --quick       # DDP, stages 0, 2, 3, one rung lower
  /usr/bin/python3 bench/zero_largest.py --runs ddp,s0 --cap-gib 3
  /usr/bin/python3 bench/zero_largest.py --runs s3cbo --start s3cbo=24x2048 --max-m 1300
Options: --runs  --cap-gib 5  --workers 4  --timeout-s 1800 (one run)  --krab build/bin/krab
--json FILE  --start RUN=LxW,... (where a search starts; default the estimate)  --max-m M (no
rung above M million parameters: with disk offload, time, not memory, bounds the size here). How long: each size is a real run, 0.5-5 min on the 2-core machine while others
compile (longer the larger the model); at --cap-gib 3 the rows ddp, s0, s1, s2 took about 25 min
in all (stage 3 not built: seconds). A larger cap means larger models: expect 1-2 h for every
row at 5 GiB once stage 3 is built (one stage-3 run of a 926 M GPT with checkpointing and bf16
at 5 GiB took about 17 min on the otherwise quiet machine: 900 s, the first default, was too short).
No PyTorch FSDP row: Debian's torch 1.13 FSDP
does not run on CPU (docs/design/zero-sharding.md §12, check 12).
"""
import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from common import PEER, PYTHON, REPO, write_text_corpus
from zero_speed import cpu_name

GIB = 1024.0 ** 3
CGROUP_ROOT = "/sys/fs/cgroup/memory"
CONTEXT, BATCH, STEPS = 32, 2, 20
CORPUS_BYTES = 1_000_000

# The ladder: (layers, width), about 1.1-1.3x more parameters a rung; heads = width / 64.
LADDER = [(4, 512), (6, 640), (8, 768), (8, 896), (8, 1024), (10, 1024), (12, 1024), (12, 1152),
          (12, 1280), (14, 1280), (16, 1280), (16, 1408), (16, 1536), (20, 1536), (24, 1536),
          (20, 1792), (24, 1792), (20, 2048), (24, 2048), (28, 2048), (32, 2048), (28, 2304),
          (32, 2304), (32, 2560), (36, 2560), (32, 3072), (40, 3072), (48, 3072)]

# Run kinds: (label, krab --set values or None for DDP, bytes per parameter per worker of a
# rough estimate, used only to choose where the search starts).
RUNS = {
    "s0": ("krab stage 0", ["parallel.zero_stage=0"], 16),
    "s1": ("krab stage 1", ["parallel.zero_stage=1"], 10),
    "s2": ("krab stage 2", ["parallel.zero_stage=2"], 7),
    "s3": ("krab stage 3", ["parallel.zero_stage=3"], 4.5),
    "s3cb": ("krab stage 3 + checkpointing + bf16",
             ["parallel.zero_stage=3", "model.activation_checkpointing=true",
              "train.precision=bf16"], 4.5),
    "s3cbo": ("krab stage 3 + checkpointing + bf16 + offload disk",
              ["parallel.zero_stage=3", "model.activation_checkpointing=true",
               "train.precision=bf16", "parallel.offload=disk"], 1.5),
    "s2cbo": ("krab stage 2 + checkpointing + bf16 + offload disk",
              ["parallel.zero_stage=2", "model.activation_checkpointing=true",
               "train.precision=bf16", "parallel.offload=disk"], 5),
    "ddp": ("PyTorch DDP (Gloo)", None, 20),
}
DEFAULT_RUNS = "ddp,s0,s1,s2,s3,s3cb,s3cbo,s2cbo"
QUICK_RUNS = "ddp,s0,s2,s3"
TRAINS = ("pass", "trained")  # every step ran and the loss fell
OVERHEAD_GIB = 0.8  # a worker's fixed part (LibTorch, data), for the search's start only

JOB = """\
name: bench-zero-largest
model: {{name: gpt, layers: 2, width: 128, heads: 2, context: %d}}
data: {{name: text, path: {corpus}, batch_size: %d, test_fraction: 0}}
train:
  threads_per_worker: 1
  seed: 0
  steps: %d
  eval_every: 0
  log_every: 1
  optimizer: {{name: adam, lr: 0.001}}
  lr_schedule: constant
comm: {{timeout_s: 600}}
checkpoint: {{dir: {ckpt}}}
""" % (CONTEXT, BATCH, STEPS)


def gpt_parameters(layers, width, context=CONTEXT, vocab=256):
    """krab's gpt (src/models/gpt.cpp): token and position embeddings, per block two LayerNorms
    (2w each), qkv (3w^2 + 3w), attention proj (w^2 + w), fc (4w^2 + 4w), mlp proj (4w^2 + w);
    a final LayerNorm and a head without bias."""
    return layers * (12 * width * width + 13 * width) + width * (vocab + context + 2 + vocab)


# --- cgroups ---------------------------------------------------------------------------------------

class Cgroups:
    """One cgroup v1 memory group per worker, created for one run and removed after it: fresh
    counters (max usage, failcnt, oom_kill) for every run."""

    def __init__(self, tag, count, cap_bytes):
        self.paths = [os.path.join(CGROUP_ROOT, f"krab-zero-largest-{os.getpid()}-{tag}-{i}")
                      for i in range(count)]
        self.rss_peak = [0] * count
        for p in self.paths:
            os.mkdir(p)
            write(os.path.join(p, "memory.limit_in_bytes"), str(cap_bytes))
            write(os.path.join(p, "memory.swappiness"), "0")
        LIVE.append(self)

    def enter(self, i):
        """preexec_fn of the child that is worker i: it and its children live in cgroup i."""
        path = os.path.join(self.paths[i], "tasks")
        return lambda: write(path, str(os.getpid()))

    def sample(self):
        """Keeps each group's largest anonymous memory seen (memory.stat's total_rss: the
        processes' own memory, without the page cache that max_usage_in_bytes also counts)."""
        for i, p in enumerate(self.paths):
            m = re.search(r"^total_rss (\d+)", read(os.path.join(p, "memory.stat")) or "", re.M)
            if m:
                self.rss_peak[i] = max(self.rss_peak[i], int(m.group(1)))

    def stats(self, i):
        p = self.paths[i]
        oom = re.search(r"oom_kill (\d+)", read(os.path.join(p, "memory.oom_control")) or "")
        return {"max_usage": int(read(os.path.join(p, "memory.max_usage_in_bytes")) or 0),
                "rss_sampled": self.rss_peak[i],
                "failcnt": int(read(os.path.join(p, "memory.failcnt")) or 0),
                "oom_kill": int(oom.group(1)) if oom else None}

    def remove(self):
        for p in (p for p in self.paths if os.path.isdir(p)):
            for _ in range(50):  # end whatever is left in it (only processes this run started)
                pids = [int(x) for x in (read(os.path.join(p, "tasks")) or "").split()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            try:
                os.rmdir(p)
            except OSError as e:
                sys.stderr.write(f"zero_largest: cannot remove {p}: {e}\n")
        if self in LIVE:
            LIVE.remove(self)


LIVE = []


def cleanup(*_):
    for cg in list(LIVE):
        cg.remove()


def on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def write_corpus(tmp):
    """The first CORPUS_BYTES of bench/common.py's text corpus: 30,303 windows, far more than
    20 steps read; small, so that the data is a small part of a worker's memory."""
    whole, part = os.path.join(tmp, "whole.txt"), os.path.join(tmp, "corpus.txt")
    write_text_corpus(whole)
    with open(whole, "rb") as f, open(part, "wb") as out:
        out.write(f.read(CORPUS_BYTES))
    os.remove(whole)
    return part


# --- one run ---------------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_procs(cmds, cgroups, env, timeout_s, log_dir):
    """Starts cmds[i] in cgroup i (each in its own session), waits for all; when one fails the
    others are ended at once (they would otherwise wait for it until comm.timeout_s). Returns
    ([exit status], [stderr text], timed out?); None and "" for the ones ended here."""
    procs, errs = [], []
    for i, cmd in enumerate(cmds):
        err = open(os.path.join(log_dir, f"stderr-{i}.txt"), "w+")
        errs.append(err)
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=err, preexec_fn=cgroups.enter(i),
                                      start_new_session=True))
    t0, timed_out, ended = time.monotonic(), False, set()
    while True:
        states = [p.poll() for p in procs]  # every one: any() would stop at the first running
        if all(c is not None for c in states):
            break
        failed = any(c not in (None, 0) for c in states)
        timed_out = time.monotonic() - t0 > timeout_s
        if failed or timed_out:
            time.sleep(1.0)  # let the failing one's launcher finish its message
            for i, p in enumerate(procs):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    ended.add(i)
            break
        cgroups.sample()
        time.sleep(0.2)
    codes = [p.wait() for p in procs]
    texts = []
    for err in errs:
        err.seek(0)
        texts.append(err.read())
        err.close()
    # The ones ended here did not fail by themselves: their status and output say nothing.
    for i in ended:
        codes[i], texts[i] = None, ""
    return codes, texts, timed_out


def losses_of(text, pattern):
    return [float(m.group(1)) for m in re.finditer(pattern, text)]


def classify(codes, texts, stats, timed_out, losses, krab):
    """(status, detail): pass, trained (every step ran and the loss fell, then a process was
    OOM-killed after the last step: krab's rank 0 writes model.pt and the final checkpoint
    there), refused, OOM, not built, timeout, or error."""
    falling = len(losses) == STEPS and sum(losses[-5:]) < sum(losses[:5])
    oom = [i for i, s in enumerate(stats) if s["oom_kill"]]
    killed = [i for i, c in enumerate(codes) if c in (137, -9)]
    nine = [i for i, t in enumerate(texts) if re.search(r"signal 9|SIGKILL|Killed", t)]
    if any("not built" in t for t in texts):
        line = next(l for t in texts for l in t.splitlines() if "not built" in l)
        return "not built", line.strip()
    if oom or killed or nine:
        who = sorted(set(oom + killed + nine))
        if not any(stats[i]["failcnt"] for i in who):
            # Killed without its group ever reaching the cap: the machine ran out of memory
            # (other processes), not this worker. Not a result.
            return "error", (f"worker(s) {who} killed by the machine's OOM killer below the cap "
                             "(the machine was short of memory): rerun when it is quieter")
        # krab's launcher prints "... worker(s) ..., rendezvous ..." once its preflight is over.
        pre = krab and all("rendezvous" not in texts[i] for i in who)
        if falling:
            return "trained", (f"{STEPS} steps, loss {sum(losses[:5]) / 5:.3f} -> "
                               f"{sum(losses[-5:]) / 5:.3f}, then OOM-killed after the last "
                               f"step: worker(s) {who}")
        where = " in the launcher's preflight" if pre else ""
        return "OOM", (f"OOM-killed{where}: worker(s) "
                       f"{who}, oom_kill {[stats[i]['oom_kill'] for i in who]}")
    refusal = [l for t in texts for l in t.splitlines()
               if re.search(r"needs? about .* per worker|MemAvailable|the cgroup limit", l)]
    if any(c == 2 for c in codes) and refusal:
        return "refused", refusal[0].strip()
    if timed_out:
        return "timeout", "the run took longer than --timeout-s"
    if any(c not in (0, None) for c in codes):
        tail = " | ".join(l for t in texts for l in t.strip().splitlines()[-3:])
        return "error", f"exit {codes}: {tail[-800:]}"
    if len(losses) < 10:
        return "error", f"{len(losses)} step losses in the output (expected {STEPS})"
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if not last < first:
        return "error", f"the loss did not go down: first 5 steps {first:.4f}, last 5 {last:.4f}"
    return "pass", f"loss {first:.3f} -> {last:.3f}"


def keep_logs(a, out, log_dir):
    """The output of a run that failed for another reason than memory is kept (its folder is
    named in the detail); the others' is removed."""
    if out["status"] == "error":
        kept = shutil.move(log_dir, a.logs)
        out["detail"] += f" (logs: {kept})"
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


def run_krab(a, run, layers, width, tmp, job):
    label, sets, _ = RUNS[run]
    tag = f"{run}-{layers}x{width}"
    log_dir = tempfile.mkdtemp(prefix=tag + "-", dir=tmp)
    report = os.path.join(log_dir, "report.json")
    port = free_port()
    sets = sets + [f"model.layers={layers}", f"model.width={width}",
                   f"model.heads={width // 64}", f"checkpoint.dir={os.path.join(log_dir, 'ck')}"]
    cmds = []
    for r in range(a.workers):
        cmd = [a.krab_copy, "train", job, "--nnodes", str(a.workers), "--node-rank", str(r),
               "--nproc-per-node", "1", "--rdzv", f"127.0.0.1:{port}"]
        cmd += ["--report", report] if r == 0 else []
        for s in sets:
            cmd += ["--set", s]
        cmds.append(cmd)
    env = dict(os.environ, KRAB_JOB_SECRET=secrets.token_hex(16))
    cg = Cgroups(tag, a.workers, a.cap_bytes)
    try:
        codes, texts, timed_out = run_procs(cmds, cg, env, a.timeout_s, log_dir)
        stats = [cg.stats(i) for i in range(a.workers)]
    finally:
        cg.remove()
    losses = losses_of(texts[0], r"krab: step \d+ loss ([-\d.e+]+)")
    status, detail = classify(codes, texts, stats, timed_out, losses, True)
    out = {"status": status, "detail": detail, "losses": losses,
           "cgroup_max_usage": max(s["max_usage"] for s in stats),
           "rss_sampled": max(s["rss_sampled"] for s in stats), "cgroups": stats}
    if status == "pass":
        with open(report) as f:
            mem = json.load(f).get("memory", {})
        ranks = mem.get("ranks", [])
        if ranks:
            out["peak_rss"] = max(x["peak_rss_bytes"] for x in ranks)
            r0 = min(ranks, key=lambda x: x["rank"])
            out["model_state"] = r0["params_bytes"] + r0["grads_bytes"] + r0["optimizer_bytes"]
            out["predicted"] = r0["predicted"].get("peak", r0["predicted"].get("total"))
            out["params_bytes_rank0"] = r0["params_bytes"]
    keep_logs(a, out, log_dir)
    return out


def run_ddp(a, layers, width, tmp):
    tag = f"ddp-{layers}x{width}"
    log_dir = tempfile.mkdtemp(prefix=tag + "-", dir=tmp)
    port = free_port()
    cmds = [[PYTHON, PEER, "--model", "gpt", "--data", a.corpus, "--test-fraction", "0",
             "--layers", str(layers), "--width", str(width), "--heads", str(width // 64),
             "--context", str(CONTEXT), "--batch-size", str(BATCH), "--steps", str(STEPS),
             "--optimizer", "adam", "--lr", "0.001", "--log-every", "1", "--warmup-steps", "0",
             "--rank", str(r), "--world-size", str(a.workers), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--iface", "lo", "--timeout-s", "600"]
            for r in range(a.workers)]
    # One thread per worker, as krab's launcher sets for its workers.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cg = Cgroups(tag, a.workers, a.cap_bytes)
    try:
        codes, texts, timed_out = run_procs(cmds, cg, env, a.timeout_s, log_dir)
        stats = [cg.stats(i) for i in range(a.workers)]
    finally:
        cg.remove()
    losses = losses_of(texts[0], r"ddp_peer: step \d+ loss ([-\d.e+]+)")
    status, detail = classify(codes, texts, stats, timed_out, losses, False)
    out = {"status": status, "detail": detail, "losses": losses,
           "cgroup_max_usage": max(s["max_usage"] for s in stats),
           "rss_sampled": max(s["rss_sampled"] for s in stats), "cgroups": stats}
    keep_logs(a, out, log_dir)
    return out


# --- the search ------------------------------------------------------------------------------------

def start_rung(run, cap_bytes):
    per_param = RUNS[run][2]
    fits = [i for i, (l, w) in enumerate(LADDER)
            if per_param * gpt_parameters(l, w) + OVERHEAD_GIB * GIB <= cap_bytes]
    return fits[-1] if fits else 0


def search(a, run, tmp, job, log):
    """Tries rungs from the estimate's upward until one does not fit (or downward until one
    does). Returns the row: the largest rung that trained, the first above it that did not."""
    tried = {}

    def attempt(i):
        layers, width = LADDER[i]
        t0 = time.monotonic()
        r = run_ddp(a, layers, width, tmp) if run == "ddp" else \
            run_krab(a, run, layers, width, tmp, job)
        r.update({"layers": layers, "width": width, "parameters": gpt_parameters(layers, width),
                  "seconds": time.monotonic() - t0})
        tried[i] = r
        if run == "s0" and r["status"] == "pass" and \
                r.get("params_bytes_rank0") not in (None, 4 * r["parameters"]):
            r["status"], r["detail"] = "error", (
                f"the report's parameters ({r['params_bytes_rank0'] // 4}) are not the closed "
                f"form's ({r['parameters']})")
        log(f"  {RUNS[run][0]}: {layers} x {width} ({r['parameters'] / 1e6:,.1f} M): "
            f"{r['status']} ({r['detail']}), {r['seconds']:.0f} s, peak RSS of a cgroup "
            f"{r['rss_sampled'] / GIB:.2f} GiB (sampled), its max usage with page cache "
            f"{r['cgroup_max_usage'] / GIB:.2f} GiB")
        return r["status"]

    i = a.start[run] if run in a.start else start_rung(run, a.cap_bytes)
    if a.quick:
        i = max(0, i - 1)
    top = max([k for k, (l, w) in enumerate(LADDER) if gpt_parameters(l, w) <= a.max_m * 1e6],
              default=0)
    i = min(i, top)
    status = attempt(i)
    if status in ("not built", "error"):
        return row(run, tried, None, i, status)
    if status in TRAINS:
        while i + 1 <= top and (status := attempt(i + 1)) in TRAINS:
            i += 1
        best, above = i, (i + 1 if i + 1 <= top else None)
    else:
        while i > 0 and (status := attempt(i - 1)) not in TRAINS + ("error",):
            i -= 1
        best, above = (i - 1 if status in TRAINS else None), i
    # A "trained" best (OOM-killed after its last step): find the largest that also ends
    # cleanly, below it.
    low = min(tried)
    while best is not None and tried[best]["status"] == "trained" and low > 0 and \
            not any(tried[k]["status"] == "pass" for k in tried if k < best):
        low -= 1
        if attempt(low) == "error":
            break
    r = row(run, tried, best, above, status if status == "error" else None)
    r["capped"] = best == top < len(LADDER) - 1
    return r


def row(run, tried, best, above, status):
    clean = [k for k in tried if tried[k]["status"] == "pass" and (best is None or k <= best)]
    return {"run": run, "label": RUNS[run][0], "status": status,
            "best": tried.get(best) if best is not None else None,
            "clean": tried[max(clean)] if clean else None,
            "above": tried.get(above) if above is not None else None,
            "tried": [tried[k] for k in sorted(tried)]}


# --- output ----------------------------------------------------------------------------------------

def size(r):
    return f"{r['layers']} x {r['width']}"


def gib(x):
    return f"{x / GIB:.2f}" if x else "—"


def print_table(rows, cap_bytes):
    base = next((r["best"]["parameters"] for r in rows if r["run"] == "s0" and r["best"]), None)
    print()
    print("| run | largest that trains (layers x width) | parameters (M) | vs stage 0 | peak RSS "
          "/ worker, cgroup (GiB) | worker VmHWM (GiB) | model state / rank (GiB) | krab's "
          "prediction (GiB) | next size up | result there | largest that also ends cleanly "
          "(M) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|")
    for r in rows:
        b, up = r["best"] or {}, r["above"]
        if r["status"] in ("not built", "error"):
            print(f"| {r['label']} | {r['status']} |" + " — |" * 7 +
                  f" {r['tried'][-1]['detail']} | — |")
            continue
        cells = [r["label"], size(b) if b else "none of the ladder",
                 f"{b['parameters'] / 1e6:,.1f}" if b else "—",
                 f"{b['parameters'] / base:.2f}x" if b and base else "—",
                 gib(b.get("rss_sampled")), gib(b.get("peak_rss")), gib(b.get("model_state")),
                 gib(b.get("predicted")),
                 f"{size(up)} ({up['parameters'] / 1e6:,.1f} M)" if up else
                 "not tried (above --max-m)" if r.get("capped") else "top of the ladder",
                 f"{up['status']}: {up['detail']}" if up else "—",
                 f"{r['clean']['parameters'] / 1e6:,.1f} ({size(r['clean'])})" if r["clean"]
                 else "none"]
        if b.get("status") == "trained":
            cells[1] += " (OOM-killed after its last step)"
        print("| " + " | ".join(cells) + " |")
    s3 = [r for r in rows if r["run"].startswith("s3") and r["best"]]
    if base and s3:
        top = max(s3, key=lambda r: r["best"]["parameters"])
        print(f"\nstage 3 / stage 0: {top['best']['parameters'] / base:.2f}x ({top['label']}; "
              "goal >= 3.5x and >= 1 B parameters)")
    print(f"cap {cap_bytes / GIB:g} GiB per worker (cgroup v1 memory.limit_in_bytes); PyTorch "
          "FSDP: no row, Debian's torch 1.13 FSDP does not run on CPU")


def main():
    p = argparse.ArgumentParser(description="the largest GPT that trains, 4 capped workers")
    p.add_argument("--runs", default=None, help=f"of {','.join(RUNS)} (default {DEFAULT_RUNS})")
    p.add_argument("--quick", action="store_true",
                   help=f"runs {QUICK_RUNS}, starting one rung lower")
    p.add_argument("--cap-gib", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    p.add_argument("--start", default="",
                   help="RUN=LAYERSxWIDTH,...: where a run's search starts (default: the estimate)")
    p.add_argument("--max-m", type=float, default=float("inf"),
                   help="no rung above this many million parameters is tried (its row then has "
                        "no size above the largest; each rung is a 20-step run: time bounds it)")
    a = p.parse_args()
    starts, a.start = a.start, {}
    for item in filter(None, starts.split(",")):
        run, _, rung = item.partition("=")
        try:
            a.start[run] = LADDER.index(tuple(int(x) for x in rung.split("x")))
        except ValueError:
            p.error(f"--start {item}: RUN=LAYERSxWIDTH of the ladder "
                    f"({', '.join(f'{l}x{w}' for l, w in LADDER)})")
    runs = (a.runs or (QUICK_RUNS if a.quick else DEFAULT_RUNS)).split(",")
    bad = [r for r in runs if r not in RUNS]
    if bad:
        p.error(f"--runs: unknown {bad}; known: {', '.join(RUNS)}")
    if os.geteuid() != 0 or not os.path.isdir(CGROUP_ROOT):
        sys.exit(f"zero_largest: needs root and cgroup v1's memory controller at {CGROUP_ROOT}")
    if not os.access(a.krab, os.X_OK) and any(r != "ddp" for r in runs):
        sys.exit(f"zero_largest: {a.krab} is not an executable; build krab first")
    a.cap_bytes = int(a.cap_gib * GIB)
    avail = int(re.search(r"MemAvailable:\s+(\d+)", open("/proc/meminfo").read()).group(1)) * 1024
    if avail < a.workers * a.cap_bytes + GIB:
        sys.exit(f"zero_largest: {a.workers} x --cap-gib {a.cap_gib:g} + 1 GiB is more than "
                 f"MemAvailable ({avail / GIB:.1f} GiB): the caps could not all be met")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    t_start, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="krab-zlarge-") as tmp:
        try:
            a.krab_copy = os.path.join(tmp, "krab")
            if os.access(a.krab, os.X_OK):
                shutil.copy2(a.krab, a.krab_copy)
            a.logs = tempfile.mkdtemp(prefix="krab-zlarge-logs-")
            a.corpus = write_corpus(tmp)
            job = os.path.join(tmp, "job.yaml")
            write(job, JOB.format(corpus=a.corpus, ckpt=os.path.join(tmp, "ck")))
            print(f"zero_largest: {cpu_name()}; {a.workers} workers, each capped at "
                  f"{a.cap_gib:g} GiB (own cgroup); GPT context {CONTEXT}, batch {BATCH} per "
                  f"worker, Adam, {STEPS} steps; runs {runs}", flush=True)

            def log(s):
                print(s, flush=True)
            for run in runs:
                rows.append(search(a, run, tmp, job, log))
        finally:
            cleanup()
            if not os.listdir(a.logs):
                os.rmdir(a.logs)
    print_table(rows, a.cap_bytes)
    print(f"total {(time.monotonic() - t_start) / 60:.1f} min")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "zero_largest", "cap_bytes": a.cap_bytes, "workers": a.workers,
                       "rows": rows}, f, indent=2)
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
