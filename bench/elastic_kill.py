#!/usr/bin/python3
"""kill -9 of a random worker at a random step: krab's elastic run goes on in place; torchrun
restarts every worker from the last checkpoint. Issue 27, "what it must show" item 1.

What it measures: krab's CNN on Fashion-MNIST (the job of bench/common.py: batch 64 per worker,
SGD 0.05 / 0.9, one thread per worker), 4 workers, 2 epochs, `elastic.enabled: true`. First the
uninterrupted elastic run (test accuracy, wall time). Then --trials runs, each killing one rank
with SIGKILL once the run's --progress-file says a chosen step is done; rank and step come from
a generator seeded with --seed (rank 0 is among the victims; the step between 10% and 80% of
the run). Per trial, from the bench's own clock (time.time() right after the kill):
  - recovery: kill -> the report's `membership[0].resumed_at` (Unix seconds: the first step of
    the new generation completed), i.e. the recovery the user sees; detect: kill -> its
    `decided_at`; and the report's own `recovery_seconds` (decision -> resumed);
  - past: kill -> the progress file first showing more steps than at the kill (the same
    measure as torchrun's below);
  - the report's `lost_steps`, `steps`, `test_accuracy`, the exit status and the wall time;
  - left: how many of the job's processes (the launcher, and every worker pid the launcher's
    RUN_DIR/workers.json named before the kill and at the end) are still alive afterwards.
The bar (issue 27): every run exits 0 with all its steps and no process left, lost steps <= 1
per failure, test accuracy within +-0.5 pt of the uninterrupted run, median recovery <= 5 s.

The peer, on the same failures: torchrun (`python3 -m torch.distributed.run --nproc_per_node 4
--max_restarts 3`, default monitor interval and static rendezvous on a free loopback port)
running bench/ddp_peer.py --torchrun with a checkpoint every --checkpoint-every steps (50; rank
0 saves, atomically) that every worker resumes from when the agent restarts the group. First
its uninterrupted run (with the checkpoints), then each trial kills the worker whose RANK is the
trial's rank (a child of the agent, found through /proc) at the same step: `restart` (kill ->
the first step completed after the restart: the agent's detection, every worker stopped and
started again, imports, data and checkpoint loaded), `past` (kill -> the progress file past the
step it had: the restart and the steps recomputed), the steps recomputed (step at the kill -
the checkpoint step it resumed from, the JSON's `resumed_from`), accuracy, exit status, wall
time, processes left. The ratio printed is torchrun's median `past` over krab's. A run that
passes --timeout-s is killed (its process group) and counts as failed.

torchrun of torch 1.13 under Python 3.11 (Debian's): `--redirects` and `--tee` at their default
"0" fail (Std.from_str("0") returns None: IntFlag iteration no longer yields the zero member),
so the bench passes `--redirects 1 --tee 1` (workers' stdout into the log folder and to the
console), which parses. torchrun sets OMP_NUM_THREADS=1 for its workers; krab's are not given it.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/elastic_kill.py                         # 10 trials, 2 epochs
  /usr/bin/python3 bench/elastic_kill.py --trials 2 --epochs 1   # short check
Options: --workers 4  --epochs 2  --trials 10  --seed 27  --checkpoint-every 50  --no-peer
--timeout-s 1200 (per run)  --krab build/bin/krab  --json FILE. The krab binary is copied to a
temporary directory first. Exit status 1 if a krab run misses the bar's exit/steps/process
checks or a planned kill did not happen (the numbers are printed first); torchrun's are only
printed. Everything runs on 127.0.0.1; nothing is downloaded.
"""
import argparse
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from common import PEER, PYTHON, REPO, machine_load, write_cnn_job
from zero_speed import cpu_name

EXAMPLES = 60000  # Fashion-MNIST's training split
POLL_S = 0.005


def progress_mtime(path):
    """When the progress file was last rewritten (ns), or None before its first write."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def read_progress(path):
    """Completed steps the progress file says, or -1 before its first write."""
    try:
        with open(path) as f:
            return int(f.read().strip() or -1)
    except (OSError, ValueError):
        return -1


def alive(pid):
    """True while pid exists and is not a zombie (a zombie no longer runs anything)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def plan_kills(seed, trials, workers, steps):
    """(rank, step) per trial: a seeded rank (rank 0 forced into one trial if the draw missed it)
    and a seeded step in [10%, 80%] of the run."""
    rng = random.Random(seed)
    lo, hi = max(1, math.ceil(0.1 * steps)), max(1, math.floor(0.8 * steps))
    plan = [(rng.randrange(workers), rng.randint(lo, hi)) for _ in range(trials)]
    if trials and all(rank != 0 for rank, _ in plan):
        k = rng.randrange(trials)
        plan[k] = (0, plan[k][1])
    assert all(0 <= r < workers and lo <= s <= hi for r, s in plan), plan
    assert not trials or any(r == 0 for r, _ in plan), plan
    return plan


class Run:
    """One job started in its own process group (so a timeout can end all of it), with a progress
    file to poll."""

    def __init__(self, cmd, progress, log, timeout_s):
        self.cmd = cmd
        self.log_path = log
        self.progress = progress
        self.deadline = time.time() + timeout_s
        self.t0 = time.time()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_progress(self, above, changed=None):
        """Polls until the progress file says more than `above` steps; returns (steps, time), or
        (None, time) if the job ended or the deadline passed first. With `changed`, also notes
        in changed["at"] when the file was first rewritten after changed["mtime"] (a restarted
        job's first step may write a count below `above`, or equal to it)."""
        while time.time() < self.deadline and self.proc.poll() is None:
            done = read_progress(self.progress)
            now = time.time()
            if changed is not None and "at" not in changed \
                    and progress_mtime(self.progress) != changed["mtime"]:
                changed["at"] = now
            if done > above:
                return done, now
            time.sleep(POLL_S)
        return None, time.time()

    def finish(self):
        """Waits for the job (killing its process group at the deadline); returns (exit status,
        wall seconds)."""
        try:
            rc = self.proc.wait(timeout=max(1.0, self.deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        self.log.close()
        if rc != 0:  # the temporary folder goes with the bench: say why here
            with open(self.log_path, errors="replace") as f:
                tail = f.read()[-3000:]
            sys.stderr.write(f"elastic_kill: {' '.join(self.cmd)} ended with {rc}; its output's "
                             f"tail:\n{tail}\n")
        return rc, time.time() - self.t0


def kill_and_watch(run, victim, at):
    """SIGKILLs victim() once `at` steps are done. Returns {"kill_step": steps done at the kill,
    "past": kill -> the progress file past them, "first": kill -> its first change (the first
    step completed after the kill)}, the times None where the run ended first."""
    done, _ = run.wait_progress(at - 1)
    mtime = progress_mtime(run.progress)  # the write that said `done` (or a later one)
    pid = victim() if done is not None else None
    if pid is None:
        return {"kill_step": done, "past": None, "first": None}
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    changed = {"mtime": mtime}
    moved, t_past = run.wait_progress(done, changed)
    return {"kill_step": done, "past": t_past - t_kill if moved is not None else None,
            "first": changed["at"] - t_kill if "at" in changed else None, "t_kill": t_kill}


# --- krab ------------------------------------------------------------------------------------

def workers_pids(run_dir):
    """{rank: pid} of RUN_DIR/workers.json, the launcher's current members ({} before it)."""
    try:
        with open(os.path.join(run_dir, "workers.json")) as f:
            return {w["rank"]: w["pid"] for w in json.load(f)["workers"]}
    except (OSError, ValueError, KeyError):
        return {}


def krab_run(a, krab, job, tmp, tag, rank=None, step=None):
    """One elastic krab run, killing `rank` after `step` steps when given."""
    run_dir = os.path.join(tmp, f"krab-{tag}")
    report = os.path.join(tmp, f"krab-{tag}.json")
    progress = os.path.join(tmp, f"krab-{tag}.progress")
    cmd = [krab, "train", job, "--report", report, "--progress-file", progress,
           "--set", f"checkpoint.dir={run_dir}", "--set", "elastic.enabled=true",
           "--set", f"parallel.workers={a.workers}", "--set", f"train.epochs={a.epochs}",
           "--set", f"parallel.zero_stage={a.zero_stage}"]
    run = Run(cmd, progress, os.path.join(tmp, f"krab-{tag}.log"), a.timeout_s)
    pids = set()
    kill = {}
    if rank is not None:
        def victim():
            members = workers_pids(run_dir)
            pids.update(members.values())
            return members.get(rank)
        kill = kill_and_watch(run, victim, step)
    rc, wall = run.finish()
    pids.update(workers_pids(run_dir).values())
    r = {"exit": rc, "wall_seconds": wall, "kill_step": kill.get("kill_step"),
         "left": sum(alive(p) for p in pids | {run.proc.pid})}
    try:
        with open(report) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return r
    r.update({"steps": rep.get("steps"), "test_accuracy": rep.get("test_accuracy"),
              "membership": rep.get("membership", [])})
    if "t_kill" in kill:
        t_kill = kill["t_kill"]
        r["past_seconds"] = kill["past"]
        if r["membership"]:
            change = r["membership"][0]
            r["lost_steps"] = sum(c.get("lost_steps", 0) for c in r["membership"])
            r["detect_seconds"] = change.get("decided_at", t_kill) - t_kill
            r["recovery_seconds"] = change["resumed_at"] - t_kill if "resumed_at" in change \
                else None
            r["report_recovery_seconds"] = change.get("recovery_seconds")
    return r


# --- torchrun ---------------------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_by_rank(parent):
    """{RANK: pid} of parent's child processes that carry torchrun's RANK in their environment."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if b"RANK" in env:
            found[int(env[b"RANK"])] = int(pid)
    return found


def peer_json(log):
    """The JSON line rank 0 printed (torchrun's --tee prefixes it with `[default0]:`)."""
    with open(log) as f:
        lines = [l[l.index("{"):] for l in f if "{\"" in l and "peer" in l]
    try:
        return json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}


def torchrun_run(a, tmp, tag, rank=None, step=None):
    """One torchrun run of ddp_peer.py with checkpoints, killing `rank` after `step` steps."""
    progress = os.path.join(tmp, f"torchrun-{tag}.progress")
    log = os.path.join(tmp, f"torchrun-{tag}.log")
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(a.workers),
           "--max_restarts", "3", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(tmp, f"torchrun-{tag}-logs"),
           PEER, "--torchrun", "--epochs", str(a.epochs), "--eval",
           "--checkpoint-dir", os.path.join(tmp, f"torchrun-{tag}-ck"),
           "--checkpoint-every", str(a.checkpoint_every), "--progress-file", progress]
    run = Run(cmd, progress, log, a.timeout_s)
    pids = set()
    kill = {}
    if rank is not None:
        def victim():
            members = children_by_rank(run.proc.pid)
            pids.update(members.values())
            return members.get(rank)
        kill = kill_and_watch(run, victim, step)
        pids.update(children_by_rank(run.proc.pid).values())  # the restarted workers
    rc, wall = run.finish()
    out = peer_json(log)
    r = {"exit": rc, "wall_seconds": wall, "kill_step": kill.get("kill_step"),
         "left": sum(alive(p) for p in pids | {run.proc.pid}),
         "steps": read_progress(progress), "test_accuracy": out.get("test_accuracy"),
         "restart_count": out.get("restart_count"), "resumed_from": out.get("resumed_from")}
    if "t_kill" in kill:
        r["past_seconds"] = kill["past"]
        r["restart_seconds"] = kill["first"]
        if r["resumed_from"] is not None:
            r["recomputed_steps"] = kill["kill_step"] - r["resumed_from"]
    return r


# --- the tables -------------------------------------------------------------------------------

def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def acc_pt(x):
    return None if x is None else 100.0 * x


def print_trial(i, rank, k, t):
    """One line per trial: krab's numbers, then torchrun's (when run)."""
    line = (f"{i:>3} {rank:>4} {fmt(k.get('kill_step'), 'd'):>5} | {k['exit']:>4} "
            f"{fmt(k.get('steps'), 'd'):>5} {fmt(k.get('lost_steps'), 'd'):>4} "
            f"{fmt(k.get('detect_seconds')):>6} {fmt(k.get('recovery_seconds')):>8} "
            f"{fmt(k.get('report_recovery_seconds')):>6} {fmt(k.get('past_seconds')):>6} "
            f"{fmt(acc_pt(k.get('test_accuracy'))):>6} {k['wall_seconds']:>6.1f} {k['left']:>4}")
    if t is not None:
        line += (f" | {t['exit']:>4} {fmt(t.get('steps'), 'd'):>5} "
                 f"{fmt(t.get('recomputed_steps'), 'd'):>5} {fmt(t.get('restart_seconds')):>7} "
                 f"{fmt(t.get('past_seconds')):>6} "
                 f"{fmt(acc_pt(t.get('test_accuracy'))):>6} {t['wall_seconds']:>6.1f} "
                 f"{t['left']:>4}")
    print(line + f" {machine_load()[0]:>5.2f}", flush=True)


def print_header(no_peer):
    """The per-trial table's head, in print_trial's columns (seconds from the bench's kill)."""
    print(f"\n{'':>14} | {'krab elastic':^64} |" + ("" if no_peer else
          f" {'torchrun restart-from-checkpoint':^50} |"))
    print(f"{'#':>3} {'rank':>4} {'step':>5} | {'exit':>4} {'steps':>5} {'lost':>4} "
          f"{'detect':>6} {'recovery':>8} {'report':>6} {'past':>6} {'acc%':>6} {'wall':>6} "
          f"{'left':>4}" + ("" if no_peer else
          f" | {'exit':>4} {'steps':>5} {'recmp':>5} {'restart':>7} {'past':>6} {'acc%':>6} "
          f"{'wall':>6} {'left':>4}") + f" {'load1':>5}", flush=True)


def median_max(values):
    values = [v for v in values if v is not None]
    return (statistics.median(values), max(values)) if values else (None, None)


def run_ok(r, steps, killed=False):
    """Exit 0, every step, nothing of the job left; and the kill done when one was planned."""
    return r["exit"] == 0 and r.get("steps") == steps and r["left"] == 0 \
        and (not killed or r.get("past_seconds") is not None)


def summarize_krab(base, krab_trials, steps):
    """krab's medians and the issue's bar; returns (every run clean, median time past the kill
    step, its max, lost steps, mean accuracy)."""
    rec, rec_max = median_max(k.get("recovery_seconds") for k in krab_trials)
    past, past_max = median_max(k.get("past_seconds") for k in krab_trials)
    lost = sum(k.get("lost_steps") or 0 for k in krab_trials)
    accs = [acc_pt(k["test_accuracy"]) for k in krab_trials if k.get("test_accuracy") is not None]
    base_acc = acc_pt(base.get("test_accuracy"))
    spread = max((abs(x - base_acc) for x in accs), default=None) if base_acc is not None else None
    ok = run_ok(base, steps) and all(run_ok(k, steps, killed=True) for k in krab_trials)
    print(f"\nkrab, {len(krab_trials)} kills: recovery (kill -> resumed_at) median "
          f"{fmt(rec)} s, max {fmt(rec_max)} s; kill -> progress past the kill step median "
          f"{fmt(past)} s, max {fmt(past_max)} s; lost steps {lost} in all")
    print(f"  test accuracy {fmt(statistics.mean(accs) if accs else None)} % (mean; stdev "
          f"{fmt(statistics.pstdev(accs) if accs else None)} pt), uninterrupted "
          f"{fmt(base_acc)} %, largest difference {fmt(spread)} pt; uninterrupted wall "
          f"{base['wall_seconds']:.1f} s")
    bar = [("every run exit 0, all steps, no process left", ok),
           ("lost steps <= 1 per failure",
            all(k.get("lost_steps") is not None and k["lost_steps"] <= 1 for k in krab_trials)),
           ("accuracy within +-0.5 pt", spread is not None and spread <= 0.5),
           ("median recovery <= 5 s", rec is not None and rec <= 5.0)]
    for name, passed in bar:
        print(f"  {'pass' if passed else 'FAIL'}: {name}")
    return ok, past, past_max, lost, statistics.mean(accs) if accs else None


def summarize_peer(a, krab_summary, base, peer_base, peer_trials, steps):
    """torchrun's numbers beside krab's (summarize_krab's) and the ratio of the medians."""
    _, past, past_max, lost, acc = krab_summary
    tpast, tpast_max = median_max(t.get("past_seconds") for t in peer_trials)
    trestart, _ = median_max(t.get("restart_seconds") for t in peer_trials)
    recomputed = sum(t.get("recomputed_steps") or 0 for t in peer_trials)
    taccs = [acc_pt(t["test_accuracy"]) for t in peer_trials if t.get("test_accuracy") is not None]
    tbase = acc_pt(peer_base.get("test_accuracy"))
    tspread = max((abs(x - tbase) for x in taccs), default=None) if tbase is not None else None
    print(f"\ntorchrun, {len(peer_trials)} kills (checkpoint every {a.checkpoint_every} steps): "
          f"kill -> progress past the kill step median {fmt(tpast)} s, max {fmt(tpast_max)} s "
          f"(kill -> first step after the restart median {fmt(trestart)} s); steps recomputed "
          f"{recomputed} in all")
    clean = run_ok(peer_base, steps) and all(run_ok(t, steps, killed=True) for t in peer_trials)
    print(f"  test accuracy {fmt(statistics.mean(taccs) if taccs else None)} % (mean), "
          f"uninterrupted {fmt(tbase)} %, largest difference {fmt(tspread)} pt; uninterrupted "
          f"wall {peer_base['wall_seconds']:.1f} s; every run exit 0, all steps, no process "
          f"left: {'yes' if clean else 'NO'}")
    print("\n| | median time lost (kill -> past the kill step) | max | steps lost or recomputed "
          "| accuracy (mean, %) | uninterrupted accuracy (%) |")
    print("|---|--:|--:|--:|--:|--:|")
    print(f"| krab elastic | {fmt(past)} s | {fmt(past_max)} s | {lost} | {fmt(acc)} | "
          f"{fmt(acc_pt(base.get('test_accuracy')))} |")
    print(f"| torchrun restart | {fmt(tpast)} s | {fmt(tpast_max)} s | {recomputed} | "
          f"{fmt(statistics.mean(taccs) if taccs else None)} | "
          f"{fmt(acc_pt(peer_base.get('test_accuracy')))} |")
    ratio = tpast / past if tpast is not None and past else None
    print(f"\ntorchrun's time lost / krab's (medians): {fmt(ratio)}x")


def main():
    p = argparse.ArgumentParser(description="kill -9 of a random worker: krab elastic vs torchrun")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=27, help="seeds the victims' ranks and steps")
    p.add_argument("--checkpoint-every", type=int, default=50, help="torchrun's checkpoints")
    p.add_argument("--no-peer", action="store_true", help="krab only, no torchrun")
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3],
                   help="krab's parallel.zero_stage (> 0: shards kept by buddies, resharded live)")
    p.add_argument("--timeout-s", type=float, default=1200, help="per run")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    a = p.parse_args()
    if not os.access(a.krab, os.X_OK):
        sys.exit(f"elastic_kill: {a.krab} is not an executable; build krab first")
    if a.workers < 2 or a.epochs < 1 or a.trials < 0:
        p.error("--workers >= 2, --epochs >= 1, --trials >= 0")
    steps = a.epochs * (EXAMPLES // (64 * a.workers))
    plan = plan_kills(a.seed, a.trials, a.workers, steps)
    with tempfile.TemporaryDirectory(prefix="krab-kill-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(a.krab, krab)
        job = write_cnn_job(os.path.join(tmp, "cnn.yaml"), "bench-kill", os.path.join(tmp, "ck"))
        print(f"elastic_kill: {cpu_name()}; CNN on Fashion-MNIST, {a.workers} workers, batch 64 "
              f"each, {a.epochs} epoch(s) = {steps} steps, krab parallel.zero_stage "
              f"{a.zero_stage}; {a.trials} kill(s), seed {a.seed}: {plan}", flush=True)
        base = krab_run(a, krab, job, tmp, "whole")
        print(f"krab uninterrupted: exit {base['exit']}, {fmt(base.get('steps'), 'd')} steps, "
              f"test accuracy {fmt(acc_pt(base.get('test_accuracy')))} %, wall "
              f"{base['wall_seconds']:.1f} s", flush=True)
        if not run_ok(base, steps):
            sys.exit("elastic_kill: the uninterrupted krab run failed; no trials")
        peer_base = None
        if not a.no_peer:
            print(f"torchrun: --nproc_per_node {a.workers} --max_restarts 3, its default monitor "
                  f"interval (5 s in torch 1.13: how often the agent looks at its workers), "
                  f"ddp_peer.py checkpointing every {a.checkpoint_every} steps", flush=True)
            peer_base = torchrun_run(a, tmp, "whole")
            print(f"torchrun uninterrupted: exit {peer_base['exit']}, "
                  f"{fmt(peer_base['steps'], 'd')} steps, "
                  f"test accuracy {fmt(acc_pt(peer_base.get('test_accuracy')))} %, wall "
                  f"{peer_base['wall_seconds']:.1f} s", flush=True)
        print_header(a.no_peer)
        krab_trials, peer_trials = [], []
        for i, (rank, step) in enumerate(plan):
            k = krab_run(a, krab, job, tmp, f"t{i}", rank, step)
            krab_trials.append(dict(k, rank=rank, planned_step=step))
            t = None
            if not a.no_peer:
                t = torchrun_run(a, tmp, f"t{i}", rank, step)
                peer_trials.append(dict(t, rank=rank, planned_step=step))
            print_trial(i, rank, k, t)
        krab_summary = summarize_krab(base, krab_trials, steps)
        if peer_base is not None:
            summarize_peer(a, krab_summary, base, peer_base, peer_trials, steps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "elastic_kill", "cpu": cpu_name(), "steps": steps,
                       "krab": {"uninterrupted": base, "trials": krab_trials},
                       "torchrun": {"uninterrupted": peer_base, "trials": peer_trials}},
                      f, indent=2)
    sys.exit(0 if krab_summary[0] else 1)


if __name__ == "__main__":
    main()
