#!/usr/bin/python3
"""Load balancing: one slow worker of four, equal slices against `parallel.balance: auto`.

What it measures (issue 27, "what it must show" item 6): 4 workers on the CNN job of
bench/common.py (batch 64 per worker, so a global batch of 256; SGD 0.05 / 0.9, 1 thread per
worker), rank 3 delayed by a fixed time per step (`train.slow_rank: 3, train.slow_delay_ms: D`,
default 150 ms: the issue's straggler). For each pair, run interleaved R times: samples/s after
warm-up (krab's report) with equal slices (`parallel.balance: off`) and with the balancer
(`auto`, re-measured every `parallel.balance_every` 10 steps, each slice moving at most 25% of
an equal one per rebalance); the ratio of the medians; the last split the balancer chose (the
report's `balance.changes`); and the final loss of both (the same global batches: they agree
within float order). Goal: >= 1.6x with the 150 ms straggler. What bounds it: the step time is
at least the delay D, whatever the split (the delay does not shrink with the slice), so the best
possible is (T + D) / max(D, 4T/3) for an unslowed step time T when every worker has a core of
its own, and never more than (B / D) / the equal split's rate: on a machine with fewer cores
than workers (2 here) the straggler's sleep frees a core for the others, so the equal split is
already faster than T + D and this second bound binds. The bench measures T (the unslowed
equal-split run, same count of steps) and prints the bound beside the ratio. The
same pair without a straggler shows what the balancer costs when there is nothing to balance
(its one small all-reduce every 10 steps; it keeps equal slices when no move gains 5%).

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/elastic_balance.py                 # 200 steps, 3 repeats
  /usr/bin/python3 bench/elastic_balance.py --steps 60 --repeats 1   # quick check
Options: --workers 4  --slow-delay-ms 150  --steps 200  --repeats 3  --krab build/bin/krab
--json FILE. The krab binary is copied to a temporary directory first. Exit status 1 if a run
fails. Everything runs on 127.0.0.1; nothing is downloaded.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from common import REPO, machine_load, run_krab, write_cnn_job
from zero_speed import cpu_name


def run(a, krab, job, tmp, balance, delay_ms, tag):
    sets = [f"parallel.workers={a.workers}", f"train.steps={a.steps}", "train.eval_every=0",
            f"parallel.balance={balance}"]
    if delay_ms > 0:
        sets += [f"train.slow_rank={a.workers - 1}", f"train.slow_delay_ms={delay_ms}"]
    r, _ = run_krab("elastic_balance", krab, job, os.path.join(tmp, f"r-{tag}.json"), sets)
    changes = r.get("balance", {}).get("changes", [])
    return {"samples_per_sec": r["samples_per_sec"], "final_loss": r["final_loss"],
            "last_split": changes[-1][1:] if changes else None, "changes": len(changes)}


def main():
    p = argparse.ArgumentParser(description="parallel.balance: auto against equal slices")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--slow-delay-ms", type=float, default=150)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every run's numbers to this file")
    a = p.parse_args()
    if not os.access(a.krab, os.X_OK):
        sys.exit(f"elastic_balance: {a.krab} is not an executable; build krab first")
    runs = []
    with tempfile.TemporaryDirectory(prefix="krab-balance-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(a.krab, krab)
        job = write_cnn_job(os.path.join(tmp, "cnn.yaml"), "bench-balance", os.path.join(tmp, "ck"))
        print(f"elastic_balance: {cpu_name()}; CNN, {a.workers} workers, batch 64 each, "
              f"{a.steps} steps, rank {a.workers - 1} delayed {a.slow_delay_ms:g} ms per step; "
              f"{a.repeats} repeat(s)", flush=True)
        print(f"{'rep':>3} {'delay':>6} {'balance':>7} {'samples/s':>10} {'loss':>8} "
              f"{'last split':>18} {'load1':>5}", flush=True)
        for rep in range(a.repeats):
            for delay in (a.slow_delay_ms, 0):
                for balance in ("off", "auto"):
                    load, busy = machine_load()
                    r = run(a, krab, job, tmp, balance, delay, f"{rep}-{delay}-{balance}")
                    r.update({"repeat": rep, "delay_ms": delay, "balance": balance,
                              "load1": load, "compilers_running": busy})
                    runs.append(r)
                    print(f"{rep:>3} {delay:>6g} {balance:>7} {r['samples_per_sec']:>10.0f} "
                          f"{r['final_loss']:>8.4f} {str(r['last_split'] or '-'):>18} "
                          f"{load:>5.2f}", flush=True)

    def med(delay, balance):
        return statistics.median(r["samples_per_sec"] for r in runs
                                 if r["delay_ms"] == delay and r["balance"] == balance)

    # The unslowed equal-split run gives T, the step time without the straggler. Two bounds on
    # what any split can do: (T + D) / max(D, W T / (W - 1)) when every worker has a core of its
    # own, and, whatever the cores, a step never shorter than D: B / D against the equal split
    # measured. On a machine with fewer cores than workers the second binds — the straggler's
    # sleep frees a core, so the equal split is already faster than T + D.
    step_ms = 1000.0 * 64 * a.workers / med(0, "off")
    d = a.slow_delay_ms
    bound = min((step_ms + d) / max(d, step_ms * a.workers / (a.workers - 1)),
                64 * a.workers / (d / 1000.0) / med(d, "off"))
    print()
    print("| straggler | equal slices (samples/s) | balanced (samples/s) | balanced / equal | "
          "best possible | last split |")
    print("|---|--:|--:|--:|--:|---|")
    for delay in (a.slow_delay_ms, 0):
        off, auto = med(delay, "off"), med(delay, "auto")
        splits = [r["last_split"] for r in runs if r["delay_ms"] == delay and r["balance"] == "auto"]
        print(f"| {f'rank {a.workers - 1}, {delay:g} ms/step' if delay else 'none'} | {off:.0f} | "
              f"{auto:.0f} | {auto / off:.2f}x | {f'{bound:.2f}x' if delay else '1.00x'} | "
              f"{splits[-1] or 'equal (no change)'} |")
    print(f"\nunslowed step time T = {step_ms:.0f} ms ({a.workers} workers, equal slices, "
          f"{os.cpu_count()} CPUs); goal >= 1.6x with the {d:g} ms straggler; best possible "
          f"min((T + D) / max(D, {a.workers}T/{a.workers - 1}), (B / D) / equal) = {bound:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "elastic_balance", "steps": a.steps, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
