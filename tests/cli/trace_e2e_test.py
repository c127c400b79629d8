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
  - an unwritable FILE (a missing directory; a directory under /proc, where even root cannot
    create files) exits 2 before any worker starts, naming --trace, and leaves nothing behind.
Usage: trace_e2e_test.py KRAB_BINARY SOURCE_DIR. Exit 0 when every check holds."""
import json
import os
import subprocess
import sys
import tempfile

STEPS, EVERY = 12, 6
PHASES = ("step.forward", "step.backward", "step.reduce", "step.optimizer")
SLACK_US = 1.0  # ts and dur are printed to the nanosecond: containment allows that rounding


def run(krab, workdir, *extra):
    cmd = [krab, "train", os.path.join(SOURCE, "examples", "fashion_cnn.yaml"),
           "--set", f"train.steps={STEPS}", "--set", "parallel.workers=2",
           "--set", f"train.eval_every={EVERY}", "--set", f"checkpoint.every_steps={EVERY}",
           "--set", "data.batch_size=32", "--set", f"checkpoint.dir={workdir}/run",
           "--set", "comm.timeout_s=60", *extra]
    # The launcher's private directories go to TMPDIR: it must be empty again at the end.
    env = dict(os.environ, TMPDIR=os.path.join(workdir, "tmp"))
    return subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=240)


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
    print("trace e2e: ok")


if __name__ == "__main__":
    SOURCE = sys.argv[2]
    main()
