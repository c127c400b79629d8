#!/usr/bin/python3
"""bench/summary.py and bench/all.py without running a benchmark (well under a second):
  - the elastic benchmarks' readers (elastic_kill with and without torchrun, elastic_balance,
    elastic_autoscale) against the numbers written in the result files of tests/bench/fixtures;
  - the table names the CPU once, above it, when every row shares one, and keeps the CPU
    column when they differ;
  - a measure whose output lacks a number shows dashes instead of ending the table;
  - `record` keeps the run's seconds in the header, and a failed run's output apart
    (FILE.failed, which no reader takes); --write-doc refuses records marked quick;
  - all.py's plan: estimates from recorded seconds or a date range, else its guess; --only,
    --skip and --quick; --resume skips what the folder has, and a failed bench is named.
Exit status 0 when every check holds; an AssertionError names the one that failed."""
import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))

import all as bench_all  # noqa: E402
import summary  # noqa: E402
import summary_records as sr  # noqa: E402


def records(*names):
    return sr.read_paths([os.path.join(FIXTURES, n) for n in names])


def close(a, b):
    return a is not None and abs(a - b) < 1e-9


def check_readers():
    (kill,) = records("elastic_kill.txt")
    k = sr.elastic_kill(kill)
    assert (k["workers"], k["steps"], k["zero_stage"], k["trials"]) == (4, 468, 0, 2), k
    assert k["epochs"] == 2 and sr.elastic_kill(records("elastic_kill_zero3.txt")[0])["epochs"] == 1
    assert k["krab"] == (0.25, 2, 88.50, 88.21), k["krab"]
    assert k["peer"] == (7.50, 61, 88.10, 88.40), k["peer"]
    assert close(k["ratio"], 30.0), k["ratio"]
    (zero3,) = records("elastic_kill_zero3.txt")
    z = sr.elastic_kill(zero3)
    assert (z["workers"], z["steps"], z["zero_stage"], z["trials"]) == (4, 234, 3, 3), z
    assert z["krab"] == (0.24, 3, 87.27, 87.00) and z["peer"] is None, z
    (bal,) = records("elastic_balance.txt")
    assert sr.elastic_balance(bal) == (4, [
        ("rank 3, 150 ms/step", 1500, 1800, 1.20, 1.14, "[70, 84, 70, 32]"),
        ("none", 5000, 4900, 0.98, 1.00, "equal (no change)")]), sr.elastic_balance(bal)
    (auto,) = records("elastic_autoscale.txt")
    assert sr.elastic_autoscale(auto) == {
        "max": 4, "runs": {"local": (2, True, 1000.0, 147.0)},
        "fixed": {1: 900.0, 2: 1200.0, 3: 2000.0, 4: 1250.0}}, sr.elastic_autoscale(auto)


def check_table():
    text = summary.table(records("elastic_kill.txt", "elastic_kill_zero3.txt",
                                 "elastic_balance.txt"))
    lines = text.splitlines()
    assert lines[0] == "Every row: 2 × Test CPU (AVX2, no AVX-512).", lines[0]
    assert lines[2] == "| what | krab | peer or limit | krab vs peer | commit | date | command |"
    rows = [l for l in lines[4:] if l.startswith("| ")]
    assert len(rows) == 4, rows  # two kill rows, the balance's straggler and none
    kill = next(r for r in rows if "2 epoch(s) = 468 steps" in r)
    assert rows.index(kill) == 0, rows  # data parallel before ZeRO stage 3
    assert "| 0.25 s, 2 steps lost in 2 kills, acc. 88.50% (uninterrupted 88.21%) |" in kill
    assert "| torchrun 7.50 s, 61 steps recomputed" in kill and "| 30.0× less time lost |" in kill
    zero3 = next(r for r in rows if "ZeRO stage 3" in r)
    assert "| no peer run | — |" in zero3, zero3
    slowed = next(r for r in rows if "rank 3, 150 ms/step" in r)
    assert "| 1,800 samples/s | equal slices 1,500; best possible 1.14× | 1.20× |" in slowed
    text = summary.table(records("elastic_balance.txt", "elastic_autoscale.txt"))
    assert text.startswith("| what | krab | peer or limit | krab vs peer | CPU |"), text[:80]
    auto = next(l for l in text.splitlines() if "Autoscaling" in l)
    assert ("| settled at 2 worker(s), 1,000 samples/s over the run | fixed size at 2: 1,200; "
            "fastest fixed size (3): 2,000 | 0.50× the fastest | 2 × Other CPU") in auto, auto


def check_record(tmp):
    bench = os.path.join(tmp, "traffic.py")  # record knows a benchmark by its script's name
    with open(bench, "w") as f:
        f.write("import sys\nprint('| w | ratio |')\nprint('|---|---|')\nprint('| 2 | 1.0 |')\n"
                "sys.exit(int(sys.argv[1]))\n")
    out = os.path.join(tmp, "ok.txt")
    with contextlib.redirect_stdout(io.StringIO()):
        assert summary.main(["record", "--note", "quick: test", out, "--", sys.executable,
                             bench, "0"]) == 0
    (rec,) = sr.read_paths([out])
    assert rec.bench == "traffic" and rec.meta["note"] == "quick: test", rec.meta
    assert rec.meta["seconds"].isdigit() and int(rec.meta["seconds"]) < 60, rec.meta
    assert rec.lines[-1] == "| 2 | 1.0 |", rec.lines
    bad = os.path.join(tmp, "bad.txt")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert summary.main(["record", bad, "--", sys.executable, bench, "3"]) == 3
    assert not os.path.exists(bad) and os.path.exists(bad + ".failed")
    quick = os.path.join(tmp, "quick")
    os.mkdir(quick)
    with open(os.path.join(FIXTURES, "elastic_balance.txt")) as f:
        text = f.read().replace("# command:", "# note: quick: smoke\n# command:", 1)
    with open(os.path.join(quick, "b.txt"), "w") as f:
        f.write(text)
    doc = os.path.join(tmp, "doc.md")
    with open(doc, "w") as f:
        f.write(f"{summary.BEGIN}\nold\n{summary.END}\n")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            summary.main([quick, "--write-doc", doc])
        raise AssertionError("--write-doc took a quick record")
    except SystemExit as e:
        assert "note: quick" in str(e), e
    with open(doc) as f:
        assert "old" in f.read()


def check_gap(tmp):
    """A measure whose output lacks a number (DDP's column empty here) shows dashes, and the
    rest of the table is still made."""
    path = os.path.join(tmp, "throughput.txt")
    with open(path, "w") as f:
        f.write("# bench: throughput\n# date: 2026-12-08 09:00 UTC\n# cpu: X\n"
                "| workers | krab samples/s | DDP samples/s |\n|---|---|---|\n| 1 | 1000 | - |\n")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        text = summary.table(sr.read_paths([path, os.path.join(FIXTURES, "elastic_balance.txt")]))
    assert "| — | — | — |" in text and "lacks a number" in err.getvalue(), text
    assert "| 1,800 samples/s |" in text, text


def check_plan():
    assert bench_all.normal("/usr/bin/python3 bench/x.py --json f.json --a 1 --krab k") == \
        "bench/x.py --a 1"
    known = bench_all.durations([FIXTURES])
    assert known["bench/elastic_kill.py --trials 2"] == 600.0, known
    assert known["bench/elastic_autoscale.py --providers local"] == 420.0, known  # 13:00–13:07
    args = argparse.Namespace(only=[], skip=["zero_largest"], quick=False, krab="")
    steps = bench_all.plan(args, {"bench/traffic.py": 90.0})
    names = [s[0] for s in steps]
    assert names[:5] == ["throughput", "own_model_speed", "real_networks", "accuracy", "traffic"]
    assert "zero_largest" not in names and len(names) == len(bench_all.PLAN) - 1, names
    traffic = steps[names.index("traffic")]
    assert traffic[2:] == (90.0, "recorded"), traffic
    assert steps[names.index("accuracy")][2:] == (300, "guess"), steps
    args = argparse.Namespace(only=["traffic"], skip=[], quick=True, krab="/k")
    (only,) = bench_all.plan(args, {})
    assert only[1] == ["/usr/bin/python3", "bench/traffic.py", "--steps", "10", "--krab", "/k"]


def check_resume(tmp):
    """--resume skips a bench whose record is in the folder; a failed one is named."""
    open(os.path.join(tmp, "traffic.txt"), "w").close()
    args = argparse.Namespace(only=["traffic", "accuracy"], skip=[], quick=True, krab="",
                              resume=True)
    ran, real = [], bench_all.subprocess.call
    bench_all.subprocess.call = lambda cmd, cwd: ran.append(cmd) or 7
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            failed = bench_all.run_pass(args, bench_all.plan(args, {}), tmp)
    finally:
        bench_all.subprocess.call = real
    assert failed == ["accuracy"] and len(ran) == 1, (failed, ran)
    assert ran[0][-3:] == ["/usr/bin/python3", "bench/accuracy.py", "--steps", "20"][-3:], ran
    assert os.path.join(tmp, "accuracy.txt") in ran[0], ran[0]
    assert "traffic: recorded already, skipped" in out.getvalue(), out.getvalue()


def main():
    check_readers()
    check_table()
    tmp = tempfile.mkdtemp(prefix="krab-summary-test-")
    try:
        check_record(tmp)
        check_gap(tmp)
        check_resume(tmp)
    finally:
        shutil.rmtree(tmp)
    check_plan()
    print("summary_test: ok")


if __name__ == "__main__":
    main()
