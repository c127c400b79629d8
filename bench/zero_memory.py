#!/usr/bin/python3
"""ZeRO memory: model-state bytes per rank, measured against the ZeRO formula, stages 0-3.

What it measures (issue 26, "what it must show" item 1): GPTs of increasing width on W workers
(default 4), each stage asked; for each run the report's `memory` field gives, per rank, the
bytes of parameters, gradients and optimizer state the rank holds (measured: storage bytes of
the engine's tensors) beside the prediction of parallel/zero/memory_model.h (the ZeRO paper's
formula for Adam in fp32, Ψ parameters incl. padding, N ranks — stage 0: 16Ψ; stage 1:
4Ψ + 4Ψ + 8Ψ/N; stage 2: 4Ψ + 12Ψ/N; stage 3: 16Ψ/N), and the peak resident memory (VmHWM).
The table shows rank 0's numbers (every rank holds the same within one unit's padding), the
measured/predicted ratio (goal: within 10%) and the peak RSS.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/zero_memory.py                   # widths 256,512,1024, stages 0-3
  /usr/bin/python3 bench/zero_memory.py --widths 128 --steps 3   # quick check
Options: --widths  --layers 4  --workers 4  --stages 0,1,2,3  --krab build/bin/krab  --json FILE
Stage 3 is attempted; a krab that refuses it as not built yet (exit 2) gives the row "not built"
and the other stages go on. The krab binary is copied to a temporary directory first. Exit
status 1 if a run fails.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from common import REPO, fail, write_gpt_job, write_text_corpus
from zero_speed import cpu_name

GIB = 1024.0 ** 3


def run_job(krab, job, report, sets):
    """common.run_krab, except that a krab that refuses `parallel.zero_stage` 3 as not built
    yet (exit 2, before any worker starts) gives None: the table says so, and the same command
    measures stage 3 once it is built."""
    cmd = [krab, "train", job, "--report", report]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode == 2 and "parallel.zero_stage" in proc.stderr and \
            "not built" in proc.stderr:
        return None
    if proc.returncode != 0 or not os.path.exists(report):
        fail("zero_memory", cmd, proc)
    with open(report) as f:
        return json.load(f)


def run(krab, job, tmp, width, layers, workers, stage, steps):
    sets = [f"parallel.workers={workers}", f"parallel.zero_stage={stage}",
            f"model.width={width}", f"model.layers={layers}", f"model.heads={max(1, width // 64)}",
            f"train.steps={steps}", "data.batch_size=4", "train.eval_every=0"]
    r = run_job(krab, job, os.path.join(tmp, f"r-{width}-{stage}.json"), sets)
    if r is None:
        return None
    mem = r.get("memory")
    if not mem or not mem.get("ranks"):
        sys.exit("zero_memory: the report has no `memory` field (krab too old?)")
    rank0 = min(mem["ranks"], key=lambda x: x["rank"])
    measured = rank0["params_bytes"] + rank0["grads_bytes"] + rank0["optimizer_bytes"]
    pred = rank0["predicted"]
    predicted = pred["params"] + pred["grads"] + pred["optimizer"]
    # The launcher's number (process + data + everything predicted in RAM), absent before krab
    # reported it: against the highest VmHWM of any rank.
    return {"width": width, "layers": layers, "stage": stage, "measured": measured,
            "predicted": predicted, "peak_rss": max(x["peak_rss_bytes"] for x in mem["ranks"]),
            "predicted_peak": pred.get("peak"), "rank0": rank0, "final_loss": r["final_loss"]}


def main():
    p = argparse.ArgumentParser(description="ZeRO model-state bytes per rank vs the formula")
    p.add_argument("--widths", default="256,512,1024")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--krab", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    a = p.parse_args()
    if not os.access(a.krab, os.X_OK):
        sys.exit(f"zero_memory: {a.krab} is not an executable; build krab first")
    runs = []
    with tempfile.TemporaryDirectory(prefix="krab-zmem-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(a.krab, krab)
        corpus = os.path.join(tmp, "corpus.txt")
        write_text_corpus(corpus)
        job = write_gpt_job(os.path.join(tmp, "gpt.yaml"), "bench-zero-mem",
                            os.path.join(tmp, "ck"), corpus)
        print(f"zero_memory: {cpu_name()}; GPT {a.layers} layers, {a.workers} workers, "
              f"batch 4 per worker, Adam, {a.steps} steps", flush=True)
        print("| width | stage | model state / rank (GiB) | predicted (GiB) | measured / predicted "
              "| peak RSS / rank (GiB) | predicted peak (GiB) | peak RSS / predicted peak |")
        print("|--:|--:|--:|--:|--:|--:|--:|--:|")
        for width in (int(w) for w in a.widths.split(",")):
            for stage in (int(s) for s in a.stages.split(",")):
                r = run(krab, job, tmp, width, a.layers, a.workers, stage, a.steps)
                if r is None:
                    print(f"| {width} | {stage} | not built | — | — | — | — | — |", flush=True)
                    continue
                runs.append(r)
                pp = r["predicted_peak"]
                peak = f"{pp / GIB:.2f} | {r['peak_rss'] / pp:.3f}" if pp else "— | —"
                print(f"| {width} | {stage} | {r['measured'] / GIB:.3f} | "
                      f"{r['predicted'] / GIB:.3f} | {r['measured'] / r['predicted']:.3f} | "
                      f"{r['peak_rss'] / GIB:.2f} | {peak} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=2)


if __name__ == "__main__":
    main()
