#!/usr/bin/python3
"""ZeRO speed and traffic: stages 1-2 (and 3 where built) against stage 0, same run otherwise.

What it measures (issue 26, "what it must show" item 3): training samples/s after warm-up
(the report's `samples_per_sec`) of krab's built-in CNN (Fashion-MNIST, bench/common.py's
throughput job: SGD lr 0.05 momentum 0.9) and small GPT (2 layers, width 128, Adam, the text
corpus of bench/common.py) at 2 and 4 workers, for each `parallel.zero_stage` asked. The stages
run interleaved (0, 1, 2, 0, 1, 2, ...) R times, so load from other processes hits all alike;
the table shows medians and each stage's ratio to stage 0 (goal: stages 1-2 >= 0.95x,
stage 3 >= 0.85x).

Traffic: the report's bytes sent during training steps, per step, summed over ranks, beside
stage 0's. The closed form (docs/design/zero-sharding.md §9): reduce-scatter + all-gather of a
stage-1/2 step move the bytes of one all-reduce (ratio 1.00, a little more for the padding of
each unit to a multiple of W x 16 elements); stage 3 about 1.5x.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/zero_speed.py                     # 200 steps, 3 repeats
  /usr/bin/python3 bench/zero_speed.py --steps 30 --repeats 1   # quick check
Options: --models cnn,gpt  --workers 2,4  --stages 0,1,2  --krab build/bin/krab  --json FILE
No PyTorch FSDP column: Debian's torch 1.13 FSDP does not run on CPU (design doc §12, check 12).
The krab binary is copied to a temporary directory first. Exit status 1 if a run fails.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import (machine_load, run_krab as run_krab_job, write_cnn_job, write_gpt_job,
                    write_text_corpus)


def cpu_name():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((l.split(":", 1)[1].strip() for l in out.splitlines()
                 if l.startswith("Model name")), "unknown CPU")
    flags = next((l.split(":", 1)[1].split() for l in out.splitlines()
                  if l.startswith("Flags")), [])
    extras = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{os.cpu_count()}-CPU {name} ({', '.join(extras) or 'no AVX2'})"


def run(krab, tmp, model, workers, stage, steps, tag):
    job = os.path.join(tmp, f"{model}.yaml")
    r, _ = run_krab_job("zero_speed", krab, job, os.path.join(tmp, f"r-{tag}.json"),
                        [f"parallel.workers={workers}", f"train.steps={steps}",
                         f"parallel.zero_stage={stage}", "train.eval_every=0"])
    measured = max(1, r.get("steps", steps) - r.get("start_step", 0))
    return {"samples_per_sec": r["samples_per_sec"], "final_loss": r["final_loss"],
            "bytes_per_step": r["bytes_sent_steps"] / measured,
            "bytes_by_op": r.get("bytes_sent_by_op", {})}


def main():
    p = argparse.ArgumentParser(description="ZeRO stages vs stage 0: samples/s and traffic")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="cnn,gpt")
    p.add_argument("--workers", default="2,4")
    p.add_argument("--stages", default="0,1,2")
    p.add_argument("--krab", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    a = p.parse_args()
    models = a.models.split(",")
    workers = [int(w) for w in a.workers.split(",")]
    stages = [int(s) for s in a.stages.split(",")]
    if 0 not in stages:
        sys.exit("zero_speed: --stages must include 0 (the ratios are against it)")
    if not os.access(a.krab, os.X_OK):
        sys.exit(f"zero_speed: {a.krab} is not an executable; build krab first")
    runs = []
    with tempfile.TemporaryDirectory(prefix="krab-zero-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(a.krab, krab)
        write_cnn_job(os.path.join(tmp, "cnn.yaml"), "bench-zero-cnn", os.path.join(tmp, "ck"))
        if "gpt" in models:
            corpus = os.path.join(tmp, "corpus.txt")
            write_text_corpus(corpus)
            write_gpt_job(os.path.join(tmp, "gpt.yaml"), "bench-zero-gpt",
                          os.path.join(tmp, "ck"), corpus)
        print(f"zero_speed: {cpu_name()}; {a.steps} steps, 1 thread per worker, models {models}, "
              f"workers {workers}, stages {stages}, {a.repeats} repeat(s)", flush=True)
        print(f"{'rep':>3} {'model':<5} {'W':>2} {'stage':>5} {'samples/s':>10} "
              f"{'bytes/step':>12} {'loss':>8} {'load1':>5}", flush=True)
        for rep in range(a.repeats):
            for m in models:
                for w in workers:
                    for s in stages:
                        load, busy = machine_load()
                        r = run(krab, tmp, m, w, s, a.steps, f"{rep}-{m}-{w}-{s}")
                        r.update({"model": m, "workers": w, "stage": s, "repeat": rep,
                                  "load1": load, "compilers_running": busy})
                        runs.append(r)
                        print(f"{rep:>3} {m:<5} {w:>2} {s:>5} {r['samples_per_sec']:>10.0f} "
                              f"{r['bytes_per_step']:>12.0f} {r['final_loss']:>8.4f} "
                              f"{load:>5.2f}", flush=True)

    def med(m, w, s, key):
        return statistics.median(r[key] for r in runs
                                 if r["model"] == m and r["workers"] == w and r["stage"] == s)

    print()
    print("| model | workers | stage | samples/s (median) | vs stage 0 | bytes/step | vs stage 0 |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for m in models:
        for w in workers:
            base_rate, base_bytes = med(m, w, 0, "samples_per_sec"), med(m, w, 0, "bytes_per_step")
            for s in stages:
                rate, b = med(m, w, s, "samples_per_sec"), med(m, w, s, "bytes_per_step")
                print(f"| {m} | {w} | {s} | {rate:.0f} | {rate / base_rate:.2f}x | {b:,.0f} | "
                      f"{b / base_bytes:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "repeats": a.repeats, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
