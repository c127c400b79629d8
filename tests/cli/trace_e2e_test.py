#!/usr/bin/python3
"""`krab train --trace FILE` end to end, as a user runs it (about 15 s on 2 cores):
  - a 2-worker CNN run of 12 steps, evaluating and checkpointing at step 6, writes FILE: JSON
    that parses, with the shape Perfetto and chrome://tracing read (traceEvents, valid phases,
    numeric ts/dur >= 0), one process per rank named by metadata;
  - per rank exactly 12 "step" spans on track 1, one after the other, each holding its
    forward, backward, reduce and optimizer, and at least one comm.bucket.* span on track 2
    that lies inside it;
  - evaluation and checkpoint spans inside step 6 and no other step;
  - monitor.profile_ops: LibTorch's operators on track 4, each inside a step of its rank, and
    every step's forward and backward holding some;
  - a run whose rank 1 is killed (SIGKILL) after step 3 still gets FILE: loadable, with the
    steps each rank had finished (a part is flushed at every step's end);
  - an unwritable FILE (a missing directory; a directory under /proc, where even root cannot
    create files) exits 2 before any worker starts, naming --trace, and leaves nothing behind.
Usage: trace_e2e_test.py KRAB_BINARY SOURCE_DIR. Exit 0 when every check holds."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

STEPS, EVERY = 12, 6
PHASES = ("step.forward", "step.backward", "step.reduce", "step.optimizer")
SLACK_US = 1.0  # ts and dur are printed to the nanosecond: containment allows that rounding


def command(krab, workdir, *extra):
    return [krab, "train", os.path.join(SOURCE, "examples", "fashion_cnn.yaml"),
           "--set", f"train.steps={STEPS}", "--set", "parallel.workers=2",
           "--set", f"train.eval_every={EVERY}", "--set", f"checkpoint.every_steps={EVERY}",
           "--set", "data.batch_size=32", "--set", f"checkpoint.dir={workdir}/run",
           "--set", "comm.timeout_s=60", "--set", "train.eval_examples=500", *extra]


def environment(workdir):
    # The launcher's private directories go to TMPDIR: it must be empty again at the end.
    return dict(os.environ, TMPDIR=os.path.join(workdir, "tmp"))


def run(krab, workdir, *extra):
    return subprocess.run(command(krab, workdir, *extra), cwd=workdir, env=environment(workdir),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)


def child_with_rank(parent, rank):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == parent and f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def check_killed_worker(krab, workdir):
    out, progress = os.path.join(workdir, "killed.json"), os.path.join(workdir, "progress")
    launcher = subprocess.Popen(
        command(krab, workdir, "--trace", out, "--progress-file", progress,
                "--set", "train.steps=400", "--set", "train.eval_every=0"),
        cwd=workdir, env=environment(workdir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    done, deadline = 0, time.monotonic() + 120
    while done < 3 and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.05)
        try:
            with open(progress) as f:
                done = int(f.read().strip() or 0)
        except (OSError, ValueError):
            pass
    assert done >= 3, ("no progress", launcher.poll())
    os.kill(child_with_rank(launcher.pid, 1), signal.SIGKILL)
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 1, (launcher.returncode, output)
    assert f"krab: trace {out}" in output, output
    with open(out) as f:
        events = json.load(f)["traceEvents"]
    check_shape(events)
    steps = {pid: sum(1 for e in events if e["ph"] == "X" and e["name"] == "step" and
                      e["pid"] == pid) for pid in (0, 1)}
    # Rank 0 ended step `done` with rank 1's gradients of that step, which rank 1 computed
    # after ending (and flushing) step done - 1.
    assert steps[0] >= done and steps[1] >= done - 1, (done, steps)
    for name in ("killed.json", "progress"):
        os.remove(os.path.join(workdir, name))


def inside(inner, outer):
    return (inner["ts"] >= outer["ts"] - SLACK_US and
            inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + SLACK_US)


def check_shape(events):
    assert events, "no events"
    for e in events:
        assert e["ph"] in ("X", "M", "i", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] > 1.5e15, e  # unix µs
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert e["tid"] in (1, 2, 3, 4), e


def check_rank(pid, events):
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
    steps = sorted((e for e in spans if e["name"] == "step"), key=lambda e: e["ts"])
    assert len(steps) == STEPS, (pid, len(steps))
    assert all(s["tid"] == 1 for s in steps)
    for a, b in zip(steps, steps[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + SLACK_US, ("steps overlap", pid, a, b)
    for n, step in enumerate(steps, 1):
        within = [e for e in spans if e is not step and inside(e, step)]
        names = [e["name"] for e in within]
        for phase in PHASES:
            assert phase in names, (pid, n, phase, names)
        buckets = [e for e in within if e["name"].startswith("comm.bucket.")]
        assert buckets and all(b["tid"] == 2 for b in buckets), (pid, n, names)
        for name in ("evaluation", "checkpoint"):
            assert (name in names) == (n % EVERY == 0 and n < STEPS), (pid, n, name, names)
    comm = [e for e in spans if e["name"].startswith("comm.")]
    assert all(any(inside(c, s) for s in steps) for c in comm), (pid, "a bucket outside steps")
    return len(spans)


def check_trace(krab, workdir):
    out = os.path.join(workdir, "T.json")
    r = run(krab, workdir, "--trace", out)
    assert r.returncode == 0, r.stdout
    assert f"krab: trace {out} (open in https://ui.perfetto.dev" in r.stdout, r.stdout
    with open(out) as f:
        trace = json.load(f)
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    check_shape(events)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}, names
    assert {e["pid"] for e in events} == {0, 1}
    assert not [e for e in events if e.get("tid") == 4], "operators without monitor.profile_ops"
    for pid in (0, 1):
        check_rank(pid, events)
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o644)
    assert sorted(os.listdir(workdir)) == ["T.json", "run", "tmp"], os.listdir(workdir)
    assert os.listdir(os.path.join(workdir, "tmp")) == [], "a private directory was left"


def check_profile_ops(krab, workdir):
    out = os.path.join(workdir, "ops.json")
    r = run(krab, workdir, "--trace", out, "--set", "monitor.profile_ops=true",
            "--set", "train.steps=2", "--set", "train.eval_every=0")
    assert r.returncode == 0, r.stdout
    with open(out) as f:
        events = json.load(f)["traceEvents"]
    check_shape(events)
    for pid in (0, 1):
        spans = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        ops = [e for e in spans if e["name"].startswith("op.")]
        assert ops and all(e["tid"] == 4 for e in ops), (pid, len(ops))
        steps = [e for e in spans if e["name"] == "step"]
        assert all(any(inside(o, s) for s in steps) for o in ops), (pid, "an op outside steps")
        for phase in ("step.forward", "step.backward"):
            for p in (e for e in spans if e["name"] == phase):
                assert any(inside(o, p) for o in ops), (pid, phase, "without operators")
    os.remove(out)


def check_refused(krab, workdir, path, why):
    before = sorted(os.listdir(workdir))
    r = run(krab, workdir, "--trace", path)
    assert r.returncode == 2, (path, r.returncode, r.stdout)
    assert f"--trace {path}" in r.stdout and why in r.stdout, r.stdout
    assert "worker(s)" not in r.stdout, ("workers started", r.stdout)
    assert sorted(os.listdir(workdir)) == before, (before, os.listdir(workdir))


def main():
    krab = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="krab-trace-e2e-") as workdir:
        os.mkdir(os.path.join(workdir, "tmp"))
        check_refused(krab, workdir, os.path.join(workdir, "missing", "T.json"), "does not exist")
        check_refused(krab, workdir, "/proc/T.json", "cannot write")
        check_trace(krab, workdir)
        check_profile_ops(krab, workdir)
        check_killed_worker(krab, workdir)
        assert os.listdir(os.path.join(workdir, "tmp")) == [], "a private directory was left"
    print("trace e2e: ok")


if __name__ == "__main__":
    SOURCE = sys.argv[2]
    main()
