"""Keeping a benchmark's output as a result file, for `summary.py record` and bench/all.py: the
header (bench, date, commit, CPU, command, note, seconds) that summary_records.py reads back, then
what the benchmark printed. A run that fails keeps its output too, in FILE.failed, which no
reader takes for a result."""
import datetime
import os
import shlex
import subprocess
import sys
import time

from summary_records import BENCHES, REPO


def cpu_name():
    """"<cores> × <model> (AVX2, AVX-512)": the vector units matter as much as the model to
    LibTorch's kernels, and two VMs of one model name differ in them."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    units = ", ".join([("AVX2" if "avx2" in flags else "no AVX2"),
                       ("AVX-512" if "avx512f" in flags else "no AVX-512")])
    return f"{os.cpu_count()} × {model} ({units})"


def header(bench, command, note=None):
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"# bench: {bench}\n# date: {now}\n# commit: {commit or 'not recorded'}\n"
            f"# cpu: {cpu_name()}\n# command: {shlex.join(command)}\n"
            + (f"# note: {note}\n" if note else ""))


def record(out, command, note=None):
    """Runs `command`, echoing its output, and writes header + output to `out`, the run's
    seconds last in the header (bench/all.py estimates a pass from them). The exit status is
    the command's; if it failed, the output goes to `out` + ".failed" instead, which no reader
    takes for a result but a person can read."""
    bench = next((b for b in BENCHES for c in command if os.path.basename(c) == b + ".py"), "")
    if not bench:
        sys.exit(f"summary: record: no bench/<name>.py of {', '.join(BENCHES)} in the command")
    head, start = header(bench, command, note), time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    head += f"# seconds: {time.monotonic() - start:.0f}\n"
    if proc.wait() != 0:
        with open(out + ".failed", "w", encoding="utf-8") as f:
            f.write(head + "".join(lines))
        print(f"summary: record: the command failed (exit status {proc.returncode}); its "
              f"output is in {out}.failed, {out} not written", file=sys.stderr)
        return proc.returncode
    with open(out, "w", encoding="utf-8") as f:
        f.write(head + "".join(lines))
    if "--json" in command[:-1]:
        meta = os.path.splitext(command[command.index("--json") + 1])[0] + ".meta"
        with open(meta, "w", encoding="utf-8") as f:
            f.write(head)
    print(f"summary: wrote {out}")
    return 0
