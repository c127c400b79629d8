#!/usr/bin/python3
"""Slow network: time to a target test accuracy for krab and PyTorch DDP on four "hosts" whose
links are slow.

What it measures: four network namespaces (the hosts) joined through a Linux bridge, one worker
per host, with --job cnn (the default) the CNN on Fashion-MNIST as in bench/common.py
(per-worker batch 64, global batch 256, SGD lr 0.05 momentum 0.9 at a constant rate, seed 0,
one thread per worker, OPENBLAS_NUM_THREADS=1 on both sides), evaluated on the full 10k test
split every --eval-every steps (default 20) and after the last step. For an unshaped link
(reference) and then each --rates value (default 100 and 20 Mbit/s; every host's egress shaped with
`tc qdisc tbf`), it runs
  (a) krab, once per --krab-config: in each namespace R
        ip netns exec NS_R krab train JOB --nnodes 4 --node-rank R --nproc-per-node 1
            --rdzv ADDR_0:PORT --set parallel.workers=4 --set comm.iface=VETH_R
            --set train.eval_every=20 --set train.epochs=2 (gpt: train.steps=180)
            [--set ...from the config]
      (node 0 hosts the rendezvous at its own address and writes --report);
  (b) PyTorch DDP, Gloo, fp32: bench/ddp_peer.py in multi-host mode, one rank per namespace
      (--rank R --world-size 4 --master-addr ADDR_0 --iface VETH_R --eval-every 20).
For every run it prints: time to target = the training seconds (evaluation time left out) of the
first evaluation with test accuracy >= --target (default 0.88; gpt 0.33), "not reached"
otherwise; the final test accuracy; samples/s = steps x 256 / training seconds (both sides
computed the same way; krab's report field samples_per_sec is kept in the JSON); krab's own
traffic meter (report `bytes_sent`, payload only) beside the sum of the 4 hosts' veth transmit
counters (`ip -s link`, read before and after the run: payload plus TCP/IP/Ethernet headers,
rendezvous, krab's peer monitor and the evaluations' small all-reduces), their ratio, and the
counters against the ring all-reduce model (steps x 2(W-1) x 1,686,568 B + (W-1) x 1,686,568 B
for the initial broadcast), and the TCP payload the veths carried (TX bytes - 66 x TX packets:
Ethernet + IPv4 + TCP-with-timestamps headers; pure ACKs are headers only) over the meter.
With --job gpt the job is instead krab's gpt (model.* defaults: 2 pre-LN blocks, width 128, 4
heads, context 64; 470,528 parameters) on a byte-level text corpus the script writes into its
temporary directory: every .py file of Debian's libpython3.11-stdlib (the standard library that
python3-torch pulls in; nothing is downloaded) in sorted path order, concatenated (5.57 MB
with 3.11.2-6+deb12u6): windows of 64+1 bytes, the last 2% of them (1,715 windows, 109,760
next-byte predictions) held out; per-worker batch 64 windows, Adam lr 0.01 constant, seed 0,
--steps 180 by default (328 steps are one epoch), and --target 0.33 next-byte test accuracy
(what fp32 reaches at about 75% of the steps). bench/ddp_peer.py --model gpt builds the same
network (bit-identical initial parameters) on the same windows in the same order; the test
accuracy on both sides is the next-byte accuracy over every position of the test windows.
The ring model above then uses the gpt's 1,882,112 gradient bytes instead of the CNN's.
Then per rate the speed-up of each krab config over DDP (DDP's time to target / krab's, and
the samples/s ratio), and each system's samples/s at a rate relative to its own unshaped run,
with the link rate that the extra training time implies (bytes a host sent / (training
seconds - the unshaped run's)): close to the shaped rate when the shaper holds it
and communication does not overlap computation. Before the runs at each rate a 4 s link check
sends TCP traffic around the ring of hosts (h0 -> h1 -> h2 -> h3 -> h0, all at once, as a ring
all-reduce does) and prints the payload rate each receiver got after the first second (TCP's
start left out); with
every host sending and receiving, its ACKs wait behind its own data in its shaped queue, so
expect somewhat less than the rate (a single flow gets 19.2 Mbit/s of payload through 20 Mbit/s
tbf, i.e. the rate with headers). The tbf queues' overlimits and drops are kept in the JSON.

Run from the repository root, as root, with Debian's python (the one that has torch):
  sudo /usr/bin/python3 bench/slow_network.py                   # unshaped, 100, 20 Mbit/s; 2 epochs
  sudo /usr/bin/python3 bench/slow_network.py --steps 40 --rates 20 --no-unshaped   # quick check
  sudo /usr/bin/python3 bench/slow_network.py --krab-config none: \\
      --krab-config onebit:comm.compression=onebit --json slow.json
  sudo /usr/bin/python3 bench/slow_network.py --job gpt --krab-config none: \\
      --krab-config powersgd:comm.compression=powersgd,comm.rank=4
Options: --job cnn|gpt (default cnn)  --rates 100,20 (Mbit/s)  --no-unshaped  --target (cnn
  0.88, gpt 0.33)  --epochs (cnn 2)  --steps N (fixed steps instead of epochs; gpt 180)
  --eval-every 20  --krab-config NAME:KEY=V[,KEY=V...] (repeatable; default one config "krab"
  without extra keys)  --krab-set KEY=V (repeatable, for every krab config)  --no-ddp
  --max-minutes M (cap per run: a run still going after M minutes is killed and shown as
  "capped", not as a failure; without it each run gets 3x its estimated time plus
  2 minutes and overrunning that is a failure)  --burst 32kb --latency 100ms (tbf)
  --link-check-seconds 4 (0 = none)  --krab build/bin/krab  --json FILE (all raw results).
Duration, estimated from 0.15 s of compute per step (4 workers on 2 cores) plus the ring's
2.53 MB per host and step at the link rate: about 2 minutes per system unshaped, 3 at
100 Mbit/s and 10 at 20 Mbit/s, i.e. about 30 minutes for the default run (krab + DDP).
--job gpt: 0.5 s of compute per step and 2.82 MB per host and step, about 2, 3 and 6 minutes
per system for 180 steps.

What it creates and removes: five network namespaces krab-slow-PID-h0..h3 and krab-slow-PID-br,
four veth pairs ksPIDh{i} (host end, address 10.214.S.{i+1}/24, S = 1 + PID % 250) /
ksPIDp{i} (bridge port) and the bridge ksPIDbr, all created inside those namespaces, so the root
namespace gets nothing (bench/netns.py); krab's binary is copied to a temporary directory
$TMPDIR/krab-slow-PID-* first (a rebuild during the benchmark cannot swap it mid-run), and job
files, reports, checkpoints and logs go there too. Every process runs under a timeout; on exit,
also on failure, Ctrl-C or SIGTERM, every process in the namespaces is killed and the
namespaces (with the veths and the bridge) and the temporary directory are deleted. Namespaces
and directories left by an earlier run that was killed with SIGKILL (its PID is gone) are
removed at start, with any process still running inside those namespaces. Traffic goes only to addresses inside these namespaces. Nothing is
downloaded. Exit status 1 if a run fails (the failing command and its stderr tail are shown).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from common import (GPT_CONTEXT, GPT_PEER_ARGS, GPT_TEST_FRACTION, PEER, PYTHON, REPO,
                    krab_warmup, machine_load, write_cnn_job, write_gpt_job, write_text_corpus)
import netns

W = 4                      # hosts = workers
BATCH = 64                 # per worker
GLOBAL_BATCH = W * BATCH

# What differs between the jobs (--job). steps_per_epoch: krab drops the last partial batch;
# the gpt's is set from the corpus once it is written (84,011 training windows with
# libpython3.11-stdlib 3.11.2-6+deb12u6: 328). gradient_bytes: float32 parameters x 4 (krab's
# gradient_bytes), for the ring model. compute_s_per_step: 4 workers on 2 cores, unshaped;
# eval_s: one evaluation of the test split; both only for the duration estimate.
GPT_STEPS = 180     # --job gpt: default length (a 20 Mbit/s DDP run takes about 6 minutes)
GPT_TARGET = 0.33   # --job gpt: default target, the next-byte test accuracy fp32 reaches at
                    # about 75% of those steps
JOBS = {
    "cnn": {"steps_per_epoch": 60000 // GLOBAL_BATCH,  # 234
            "gradient_bytes": 1686568,   # the CNN's 421,642 parameters
            "compute_s_per_step": 0.15,  # ~2,000 samples/s (docs/benchmarks.md)
            "eval_s": 1.5, "target": 0.88, "epochs": 2, "steps": 0},
    "gpt": {"steps_per_epoch": None,
            "gradient_bytes": 1882112,   # the gpt's 470,528 parameters
            "compute_s_per_step": 0.5,   # ~500 samples/s (64-byte windows)
            "eval_s": 2.0, "target": GPT_TARGET, "epochs": 0, "steps": GPT_STEPS},
}
JOB = JOBS["cnn"]  # main() sets the one --job names

ACTIVE = []  # processes started and not yet reaped


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ring_bytes(steps):
    """What a ring all-reduce of every gradient, once a step, puts on the wire (all hosts)."""
    return steps * 2 * (W - 1) * JOB["gradient_bytes"] + (W - 1) * JOB["gradient_bytes"]


def estimate_seconds(steps, rate_mbit, eval_every):
    comm = (0.0 if rate_mbit is None
            else 2 * (W - 1) / W * JOB["gradient_bytes"] * 8 / (rate_mbit * 1e6))
    evals = steps // eval_every + 1 if eval_every else 1
    return 20 + steps * (JOB["compute_s_per_step"] + comm) + evals * JOB["eval_s"]


def rate_name(rate_mbit):
    return "unshaped" if rate_mbit is None else f"{rate_mbit:g} Mbit/s"


# --- processes ------------------------------------------------------------------------------------

class RunFailed(Exception):
    pass


def stop(proc):
    """SIGTERM, then SIGKILL, to the process's own session (it was started with setsid)."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    if proc in ACTIVE:
        ACTIVE.remove(proc)


def run_group(cmds, cwds, logdir, names, env, timeout, grace=20):
    """Starts the commands together, waits until all have exited, one has failed (the others
    get `grace` seconds to notice before they are killed) or `timeout` has passed. Returns
    (return codes: None = killed, the order in which they exited, seconds, timed out)."""
    procs = []
    t0 = time.perf_counter()
    done_order, timed_out = [], False
    try:
        for cmd, cwd, name in zip(cmds, cwds, names):
            with open(os.path.join(logdir, name + ".out"), "w") as out, \
                    open(os.path.join(logdir, name + ".err"), "w") as err:
                p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            procs.append(p)
            ACTIVE.append(p)
        failed_at = None
        while True:
            for i, p in enumerate(procs):
                if i not in done_order and p.poll() is not None:
                    done_order.append(i)
            if len(done_order) == len(procs):
                break
            now = time.perf_counter()
            if failed_at is None and any(procs[i].returncode != 0 for i in done_order):
                failed_at = now
            if failed_at is not None and now - failed_at > grace:
                break
            if now - t0 > timeout:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            stop(p)
    rcs = [p.returncode if i in done_order else None for i, p in enumerate(procs)]
    return rcs, done_order, time.perf_counter() - t0, timed_out


def tail(path, n=3000):
    try:
        with open(path, errors="replace") as f:
            text = f.read().replace("\r", "\n")
    except OSError:
        return ""
    return text[-n:]


def check_group(what, cmds, logdir, names, rcs, order, timed_out, capped):
    """Raises RunFailed naming the first process that failed (or all, on a timeout)."""
    if timed_out and capped:
        return "capped"
    if timed_out:
        running = [names[i] for i, rc in enumerate(rcs) if rc is None]
        msg = [f"{what}: timed out (still running: {', '.join(running)})"]
        for i in range(len(cmds)):
            msg.append(f"--- {names[i]}: {' '.join(cmds[i])}\n--- stderr (tail) ---\n"
                       + tail(os.path.join(logdir, names[i] + ".err"), 1500))
        raise RunFailed("\n".join(msg))
    bad = [i for i in order if rcs[i] != 0]
    if not bad:
        return "ok"
    i = bad[0]
    others = ", ".join(f"{names[j]}: {'killed' if rcs[j] is None else rcs[j]}"
                       for j in range(len(cmds)) if j != i)
    raise RunFailed(
        f"{what}: {names[i]} failed first with exit status {rcs[i]} ({others})\n"
        f"command: {' '.join(cmds[i])}\n"
        f"--- stdout (tail) ---\n{tail(os.path.join(logdir, names[i] + '.out'), 1500)}\n"
        f"--- stderr (tail) ---\n{tail(os.path.join(logdir, names[i] + '.err'), 3000)}")


# --- link check -----------------------------------------------------------------------------------

LINK_SERVER = r"""
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
skip = float(sys.argv[3])
s.listen(1)
s.settimeout(30)
c, _ = s.accept()
c.settimeout(30)
n, t0, t1, n_skip, t_skip = 0, None, None, None, None
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    t1 = time.perf_counter()
    if t0 is None:
        t0 = t1
    if t_skip is None and t1 - t0 >= skip:
        n_skip, t_skip = n, t1
    n += len(d)
if t_skip is None:
    n_skip, t_skip = 0, t0
print(n, (t1 - t0) if n else 0.0, n - n_skip, (t1 - t_skip) if n else 0.0)
"""

LINK_CLIENT = r"""
import socket, sys, time
deadline = time.perf_counter() + 10
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        break
    except OSError:
        if time.perf_counter() > deadline:
            raise
        time.sleep(0.05)
c.settimeout(30)
buf = bytes(1 << 16)
end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    c.sendall(buf)
c.shutdown(socket.SHUT_WR)
c.recv(1)
"""


def link_check(hosts, seconds, tmp, env, port):
    """Every host sends TCP for `seconds` to the next one around the ring, all at once.
    Returns per host: the payload Mbit/s its right neighbour received after the first quarter
    of the transfer (TCP's start is left out), and its veth TX counter and tbf statistics."""
    skip = seconds / 4
    logdir = os.path.join(tmp, f"link-{port}")
    os.makedirs(logdir)
    cmds, names = [], []
    for i in range(W):
        cmds.append(["ip", "netns", "exec", hosts.ns[i], sys.executable, "-c", LINK_SERVER,
                     hosts.addrs[i], str(port), str(skip)])
        names.append(f"server{i}")
    for i in range(W):
        cmds.append(["ip", "netns", "exec", hosts.ns[i], sys.executable, "-c", LINK_CLIENT,
                     hosts.addrs[(i + 1) % W], str(port), str(seconds)])
        names.append(f"client{i}")
    tx0, q0 = hosts.tx_bytes(), hosts.qdisc_stats()
    rcs, order, elapsed, timed_out = run_group(cmds, [tmp] * len(cmds), logdir, names, env,
                                               timeout=seconds + 40, grace=5)
    tx1, q1 = hosts.tx_bytes(), hosts.qdisc_stats()
    check_group("link check", cmds, logdir, names, rcs, order, timed_out, capped=False)
    out = []
    for i in range(W):
        receiver = (i + 1) % W
        n, secs, n_late, secs_late = open(os.path.join(logdir, f"server{receiver}.out")).read().split()
        n, secs, n_late, secs_late = int(n), float(secs), int(n_late), float(secs_late)
        out.append({"host": i, "received_bytes": n, "seconds": secs,
                    "goodput_mbit_all": n * 8 / secs / 1e6 if secs > 0 else 0.0,
                    "goodput_mbit": n_late * 8 / secs_late / 1e6 if secs_late > 0 else 0.0,
                    "tx_counter_bytes": tx1[i] - tx0[i],
                    "qdisc": delta_qdisc(q0[i], q1[i])})
    return out


def delta_qdisc(a, b):
    d = {"kind": b.get("kind")}
    for k in ("bytes", "packets", "drops", "overlimits", "requeues"):
        if isinstance(a.get(k), int) and isinstance(b.get(k), int):
            d[k] = b[k] - a[k]
    return d


# --- the runs -------------------------------------------------------------------------------------

def length_sets(args):
    if args.steps > 0:
        return ["train.steps=%d" % args.steps]
    return ["train.steps=0", "train.epochs=%d" % args.epochs]


def krab_cmds(args, hosts, krab, job, tmp, tag, sets, port, report):
    cmds, cwds = [], []
    for r in range(W):
        cwd = os.path.join(tmp, tag, f"node{r}")
        os.makedirs(cwd)
        cmd = ["ip", "netns", "exec", hosts.ns[r], krab, "train", job,
               "--nnodes", str(W), "--node-rank", str(r), "--nproc-per-node", "1",
               "--rdzv", f"{hosts.addrs[0]}:{port}"]
        mine = ([f"parallel.workers={W}", f"comm.iface={hosts.ifaces[r]}",
                 f"checkpoint.dir={os.path.join(cwd, 'ckpt')}",
                 f"train.eval_every={args.eval_every}"] + length_sets(args))
        for s in mine + sets:  # the config's keys last: they may override ours
            cmd += ["--set", s]
        if r == 0:
            cmd += ["--report", report]
        cmds.append(cmd)
        cwds.append(cwd)
    return cmds, cwds


def ddp_cmds(args, hosts, tmp, tag, port, steps):
    cmds, cwds = [], []
    length = ["--steps", str(args.steps)] if args.steps > 0 else ["--epochs", str(args.epochs)]
    for r in range(W):
        cwd = os.path.join(tmp, tag, f"rank{r}")
        os.makedirs(cwd)
        cmds.append(["ip", "netns", "exec", hosts.ns[r], PYTHON, PEER,
                     "--rank", str(r), "--world-size", str(W),
                     "--master-addr", hosts.addrs[0], "--master-port", str(port),
                     "--iface", hosts.ifaces[r], "--batch-size", str(BATCH)]
                    + (GPT_PEER_ARGS + ["--data", args.corpus] if args.job == "gpt" else
                       ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"])
                    + ["--eval-every", str(args.eval_every),
                       "--warmup-steps", str(krab_warmup(steps)), "--timeout-s", "300"] + length)
        cwds.append(cwd)
    return cmds, cwds


def summarise(raw, target, steps_hint):
    """The quantities of the table from a krab report or a DDP JSON line."""
    evals = raw.get("evals") or []
    ttt = next(((e["seconds"], e["step"]) for e in evals if e["test_accuracy"] >= target),
               (None, None))
    steps = raw.get("steps", steps_hint)
    train_s = raw.get("train_seconds") or (evals[-1]["seconds"] if evals else None)
    return {
        "steps": steps,
        "evals": evals,
        "time_to_target": ttt[0],
        "step_at_target": ttt[1],
        "final_accuracy": raw.get("test_accuracy"),
        "train_seconds": train_s,
        "samples_per_sec": steps * GLOBAL_BATCH / train_s if train_s else None,
        "reported_samples_per_sec": raw.get("samples_per_sec"),
        "final_loss": raw.get("final_loss"),
    }


def one_run(system, args, hosts, env, tmp, tag, rate, port, steps, krab=None, job=None,
            sets=()):
    logdir = os.path.join(tmp, tag)
    os.makedirs(logdir)
    report = os.path.join(logdir, "report.json")
    if system == "ddp":
        cmds, cwds = ddp_cmds(args, hosts, tmp, tag, port, steps)
        names = [f"rank{r}" for r in range(W)]
    else:
        cmds, cwds = krab_cmds(args, hosts, krab, job, tmp, tag, list(sets), port, report)
        names = [f"node{r}" for r in range(W)]
    timeout = (args.max_minutes * 60 if args.max_minutes
               else 3 * estimate_seconds(steps, rate, args.eval_every) + 120)
    load, compilers = machine_load()
    leftovers = hosts.kill_all()  # nothing should be running in the namespaces now
    tx0, q0 = hosts.tx_counters(), hosts.qdisc_stats()
    rcs, order, elapsed, timed_out = run_group(cmds, cwds, logdir, names, env, timeout)
    tx1, q1 = hosts.tx_counters(), hosts.qdisc_stats()
    leftovers += hosts.kill_all()
    status = check_group(f"{system} at {rate_name(rate)}", cmds, logdir, names, rcs, order,
                         timed_out, capped=bool(args.max_minutes))
    result = {"system": system, "rate_mbit": rate, "sets": list(sets), "status": status,
              "process_seconds": elapsed, "timeout_s": timeout, "load1": load,
              "compilers_running": compilers, "leftover_processes_killed": leftovers,
              "commands": [" ".join(c) for c in cmds],
              "iface_tx_bytes": [b[0] - a[0] for a, b in zip(tx0, tx1)],
              "iface_tx_packets": [b[1] - a[1] for a, b in zip(tx0, tx1)],
              "qdisc": [delta_qdisc(a, b) for a, b in zip(q0, q1)]}
    result["iface_bytes"] = sum(result["iface_tx_bytes"])
    # TCP payload the interfaces carried: every packet here is Ethernet (14) + IPv4 (20) + TCP
    # with timestamps (32) = 66 bytes of headers (pure ACKs are nothing else), the rest is
    # payload. Payload bytes are what the meter counts, plus what it rightly leaves out (the
    # rendezvous store, the peer monitor's heartbeats, Gloo's connection set-up).
    result["iface_payload_bytes"] = result["iface_bytes"] - HEADER_BYTES * sum(
        result["iface_tx_packets"])
    if status == "capped":
        return result
    if system == "ddp":
        lines = [l for l in tail(os.path.join(logdir, "rank0.out"), 10**7).splitlines()
                 if l.startswith("{")]
        if not lines:
            raise RunFailed(f"ddp at {rate_name(rate)}: rank 0 printed no JSON line\n"
                            f"command: {' '.join(cmds[0])}\n--- stderr (tail) ---\n"
                            + tail(os.path.join(logdir, "rank0.err")))
        raw = json.loads(lines[-1])
        result["meter_bytes"] = None
        result["meter_bytes_steps"] = None
    else:
        if not os.path.exists(report):
            raise RunFailed(f"{system} at {rate_name(rate)}: node 0 wrote no report\n"
                            f"command: {' '.join(cmds[0])}\n--- stderr (tail) ---\n"
                            + tail(os.path.join(logdir, "node0.err")))
        with open(report) as f:
            raw = json.load(f)
        raw.pop("config", None)
        result["meter_bytes"] = raw.get("bytes_sent")
        result["meter_bytes_steps"] = raw.get("bytes_sent_steps")
    result.update(summarise(raw, args.target, steps))
    result["raw"] = raw
    result["ring_model_bytes"] = ring_bytes(result["steps"])
    train_s = result["train_seconds"]
    result["per_host_tx_mbit_during_training"] = (
        result["iface_bytes"] / W * 8 / train_s / 1e6 if train_s else None)
    return result


# --- output ---------------------------------------------------------------------------------------

def fmt_s(x):
    return "—" if x is None else f"{x:,.1f} s"


HEADER_BYTES = 66  # Ethernet + IPv4 + TCP with the timestamp option, per packet


def fmt_mb(x):
    return "—" if x is None else f"{x / 1e6:,.1f} MB"


def print_tables(runs, target, systems, rates):
    print()
    print(f"| link | system | time to {target:g} (step) | final acc. | samples/s | "
          f"meter bytes | iface bytes | iface / meter | iface payload / meter | "
          f"iface / ring model | TX Mbit/s per host |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        if r["status"] == "capped":
            print(f"| {rate_name(r['rate_mbit'])} | {r['system']} | capped after "
                  f"{r['process_seconds'] / 60:.1f} min | — | — | — | "
                  f"{fmt_mb(r['iface_bytes'])} | — | — | — | — |")
            continue
        ttt = ("not reached" if r["time_to_target"] is None
               else f"{r['time_to_target']:,.1f} s ({r['step_at_target']})")
        meter = r["meter_bytes"]
        ratio = f"{r['iface_bytes'] / meter:.3f}" if meter else "—"
        payload = (f"{r['iface_payload_bytes'] / meter:.3f}"
                   if meter and "iface_payload_bytes" in r else "—")
        ring = f"{r['iface_bytes'] / r['ring_model_bytes']:.3f}"
        acc = "—" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}"
        sps = "—" if r["samples_per_sec"] is None else f"{r['samples_per_sec']:,.0f}"
        tx = r["per_host_tx_mbit_during_training"]
        print(f"| {rate_name(r['rate_mbit'])} | {r['system']} | {ttt} | {acc} | {sps} | "
              f"{fmt_mb(meter)} | {fmt_mb(r['iface_bytes'])} | {ratio} | {payload} | {ring} | "
              f"{'—' if tx is None else f'{tx:.1f}'} |")

    def find(system, rate):
        return next((r for r in runs if r["system"] == system and r["rate_mbit"] == rate
                     and r["status"] == "ok"), None)

    krabs = [s for s in systems if s != "ddp"]
    if "ddp" in systems and krabs:
        print()
        print("Speed-up over DDP (DDP's time to target / krab's; samples/s krab / DDP):")
        for rate in rates:
            d = find("ddp", rate)
            for s in krabs:
                k = find(s, rate)
                if not (k and d):
                    print(f"  {rate_name(rate):>13} {s}: — (a run is missing or capped)")
                    continue
                if k["time_to_target"] and d["time_to_target"]:
                    tt = f"{d['time_to_target'] / k['time_to_target']:.2f}x"
                else:
                    tt = ("— (target not reached by "
                          + " and ".join(n for n, x in ((s, k), ("ddp", d))
                                         if x["time_to_target"] is None) + ")")
                print(f"  {rate_name(rate):>13} {s}: time to target {tt}, samples/s "
                      f"{k['samples_per_sec'] / d['samples_per_sec']:.2f}x")
    if None in rates and len(rates) > 1:
        print()
        print("samples/s relative to the same system's unshaped run (in brackets the link rate "
              "the extra training time implies: bytes per host / extra seconds):")
        for s in systems:
            base = find(s, None)
            parts = []
            for rate in rates:
                if rate is None:
                    continue
                r = find(s, rate)
                if not (r and base):
                    parts.append(f"{rate_name(rate)} —")
                    continue
                implied = r.get("implied_link_mbit")
                parts.append(f"{rate_name(rate)} "
                             f"{r['samples_per_sec'] / base['samples_per_sec']:.2f}"
                             + (f" ({implied:.1f} Mbit/s)" if implied else ""))
            print(f"  {s}: " + ", ".join(parts))


# --- main -----------------------------------------------------------------------------------------

def parse_config(text):
    name, sep, rest = text.partition(":")
    if not sep or not name or name == "ddp":
        raise argparse.ArgumentTypeError(
            f"'{text}': expected NAME:KEY=V[,KEY=V...] (NAME not 'ddp'), e.g. none: or "
            f"onebit:comm.compression=onebit")
    sets = [s for s in rest.split(",") if s]
    for s in sets:
        if "=" not in s:
            raise argparse.ArgumentTypeError(f"'{s}' in '{text}' is not KEY=VALUE")
    return name, sets


def parse_rates(text):
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected Mbit/s values such as 100,20")
    if any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError("rates must be positive")
    return [int(r) if r == int(r) else r for r in rates]


def stale_tmp_dirs():
    """Temporary directories of earlier runs killed with SIGKILL (their PID is gone)."""
    top = tempfile.gettempdir()
    for name in os.listdir(top):
        m = re.match(r"^krab-slow-(\d+)-[^/]+$", name)
        if m and os.path.isdir(os.path.join(top, name)) and not pid_alive(int(m.group(1))):
            yield os.path.join(top, name)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Terminated(Exception):
    pass


def on_signal(signum, frame):
    raise Terminated(signal.Signals(signum).name)


def main():
    p = argparse.ArgumentParser(description="time to accuracy of krab and PyTorch DDP on four "
                                "network namespaces with tbf-shaped links")
    p.add_argument("--rates", type=parse_rates, default=[100, 20],
                   help="shaped link rates in Mbit/s (default 100,20)")
    p.add_argument("--no-unshaped", action="store_true", help="skip the unshaped reference")
    p.add_argument("--job", choices=sorted(JOBS), default="cnn",
                   help="cnn on Fashion-MNIST (default) or gpt on a text corpus")
    p.add_argument("--target", type=float,
                   help=f"test accuracy to reach (default: cnn {JOBS['cnn']['target']:g}, "
                        f"gpt {JOBS['gpt']['target']:g})")
    p.add_argument("--epochs", type=int, help="default: cnn 2 (gpt: --steps)")
    p.add_argument("--steps", type=int, default=0,
                   help=f"fixed steps instead of --epochs (default: gpt {GPT_STEPS})")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--krab-config", type=parse_config, action="append", default=[],
                   metavar="NAME:KEY=V[,KEY=V...]")
    p.add_argument("--krab-set", action="append", default=[], metavar="KEY=V",
                   help="--set for every krab config")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--max-minutes", type=float, default=0,
                   help="cap per run; a run still going is killed and shown as capped")
    p.add_argument("--burst", default="32kb", help="tbf burst (default 32kb = 32 KiB)")
    p.add_argument("--latency", default="100ms", help="tbf latency (queue length)")
    p.add_argument("--link-check-seconds", type=float, default=4)
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's raw results to this file")
    args = p.parse_args()
    global JOB
    JOB = JOBS[args.job]
    if args.target is None:
        args.target = JOB["target"]
    if args.epochs is None:
        args.epochs = JOB["epochs"]
        if args.steps == 0:
            args.steps = JOB["steps"]
    if args.eval_every < 1 or (args.steps <= 0 and args.epochs <= 0) or args.steps < 0:
        p.error("--eval-every must be >= 1, and --steps or --epochs positive")
    configs = args.krab_config or [("krab", [])]
    names = [n for n, _ in configs]
    if len(set(names)) != len(names):
        p.error("--krab-config names must differ")
    configs = [(n if n.startswith("krab") else f"krab:{n}", args.krab_set + sets)
               for n, sets in configs]
    rates = ([] if args.no_unshaped else [None]) + args.rates
    if not rates:
        p.error("nothing to run: --no-unshaped and no --rates")

    if os.geteuid() != 0:
        sys.exit("slow_network: needs root (it creates network namespaces); run it with sudo")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            sys.exit(f"slow_network: the '{tool}' command (iproute2) is not installed")
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"slow_network: {args.krab} is not an executable; build krab first")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    systems = [n for n, _ in configs] + ([] if args.no_ddp else ["ddp"])
    runs, links, failed, steps, corpus = [], [], None, None, None
    tmp = tempfile.mkdtemp(prefix=f"krab-slow-{os.getpid()}-")
    hosts = None
    try:
        for ns in netns.remove_stale():
            log(f"removed stale namespace {ns} (and killed what ran in it)")
        for d in stale_tmp_dirs():
            shutil.rmtree(d, ignore_errors=True)
            log(f"removed stale directory {d}")
        krab = os.path.join(tmp, "krab")
        shutil.copy2(args.krab, krab)  # a snapshot: the other build may replace build/bin/krab
        if args.job == "gpt":
            args.corpus = os.path.join(tmp, "corpus.txt")
            size, files, version = write_text_corpus(args.corpus)
            windows = size // (GPT_CONTEXT + 1)  # as krab's text loader
            n_test = min(max(int(windows * GPT_TEST_FRACTION + 0.5), 1), windows - 1)
            JOB["steps_per_epoch"] = (windows - n_test) // GLOBAL_BATCH
            corpus = {"bytes": size, "files": files, "package_version": version,
                      "train_windows": windows - n_test, "test_windows": n_test}
            log(f"corpus: {files} .py files of libpython3.11-stdlib {version}, {size:,} bytes: "
                f"{windows - n_test:,} training and {n_test:,} test windows of 64+1 bytes, "
                f"{JOB['steps_per_epoch']} steps per epoch")
            job = write_gpt_job(os.path.join(tmp, "job.yaml"), "bench-slow-network-gpt",
                                os.path.join(tmp, "ckpt"), args.corpus)
        else:
            job = write_cnn_job(os.path.join(tmp, "job.yaml"), "bench-slow-network",
                                os.path.join(tmp, "ckpt"))
        steps = args.steps if args.steps > 0 else args.epochs * JOB["steps_per_epoch"]
        est = sum(estimate_seconds(steps, r, args.eval_every) for r in rates) * len(systems)
        hosts = netns.Hosts(W)
        hosts.up()
        log(f"{W} hosts {', '.join(f'{n} ({i} {a})' for n, i, a in zip(hosts.ns, hosts.ifaces, hosts.addrs))}"
            f", bridge {hosts.bridge} in {hosts.bridge_ns}")
        log(f"job {args.job}: {steps} steps, global batch {GLOBAL_BATCH}, eval every "
            f"{args.eval_every}, target {args.target:g}; systems {', '.join(systems)}; links "
            f"{', '.join(rate_name(r) for r in rates)}; estimated {est / 60:.0f} min"
            + (f", at most {args.max_minutes:g} min per run" if args.max_minutes else ""))
        for s in configs:
            log(f"{s[0]}: " + (" ".join(f"--set {x}" for x in s[1]) or "(no extra --set)"))
        port = 29500
        for rate in rates:
            hosts.shape(rate, args.burst, args.latency)
            log(f"link {rate_name(rate)}: {hosts.qdisc_show(0)}")
            if args.link_check_seconds > 0:
                port += 1
                lc = link_check(hosts, args.link_check_seconds, tmp, env, port)
                links.append({"rate_mbit": rate, "hosts": lc})
                log("  link check, Mbit/s received around the ring: "
                    + ", ".join(f"h{x['host']}->h{(x['host'] + 1) % W} {x['goodput_mbit']:.1f}"
                                for x in lc)
                    + "; tbf overlimits " + ", ".join(str(x["qdisc"].get("overlimits", "—"))
                                                      for x in lc))
            for system in systems:
                port += 1
                tag = f"{system.replace(':', '-')}-{rate or 'unshaped'}-{port}"
                log(f"  {system} at {rate_name(rate)} ...")
                if system == "ddp":
                    r = one_run("ddp", args, hosts, env, tmp, tag, rate, port, steps)
                else:
                    sets = dict(configs)[system]
                    r = one_run(system, args, hosts, env, tmp, tag, rate, port, steps,
                                krab=krab, job=job, sets=sets)
                base = next((b for b in runs if b["system"] == system
                             and b["rate_mbit"] is None and b["status"] == "ok"), None)
                if (rate is not None and base and r["status"] == "ok"
                        and r["train_seconds"] > base["train_seconds"]):
                    r["implied_link_mbit"] = (r["iface_bytes"] / W * 8 / 1e6
                                              / (r["train_seconds"] - base["train_seconds"]))
                runs.append(r)
                if r["status"] == "capped":
                    log(f"    capped after {r['process_seconds'] / 60:.1f} min")
                else:
                    ttt = ("not reached" if r["time_to_target"] is None
                           else f"{r['time_to_target']:.1f} s at step {r['step_at_target']}")
                    log(f"    {r['process_seconds']:.0f} s: time to {args.target:g} {ttt}, final "
                        f"accuracy {r['final_accuracy']:.4f}, {r['samples_per_sec']:.0f} "
                        f"samples/s, interface {r['iface_bytes'] / 1e6:.1f} MB"
                        + (f", meter {r['meter_bytes'] / 1e6:.1f} MB"
                           if r["meter_bytes"] else "")
                        + f" (load {r['load1']:.2f}, compilers {r['compilers_running']})")
    except RunFailed as e:
        failed = str(e)
    except netns.NetError as e:
        failed = f"network set-up: {e}"
    except KeyboardInterrupt:
        failed = "interrupted (Ctrl-C); everything it created has been removed"
    except Terminated as e:
        failed = f"terminated by {e}; everything it created has been removed"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the clean-up finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for proc in list(ACTIVE):
            stop(proc)
        errors = hosts.down() if hosts else []
        shutil.rmtree(tmp, ignore_errors=True)
        for e in errors:
            sys.stderr.write(f"slow_network: clean-up: {e}\n")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    if runs:
        print_tables(runs, args.target, systems, rates)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "krab_config"},
                       "job": args.job, "corpus": corpus, "krab_configs": configs,
                       "steps": steps, "workers": W,
                       "global_batch": GLOBAL_BATCH, "link_checks": links, "runs": runs,
                       "failure": failed}, f, indent=2)
    if failed:
        sys.stderr.write(f"\nslow_network: {failed}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
