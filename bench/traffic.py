#!/usr/bin/python3
"""Traffic: does krab put on the wire what a ring all-reduce should?

What it measures, for W = 2, 3, 4 workers and S steps (default 50) of the CNN on Fashion-MNIST:
  1. krab's own meter: report `bytes_sent_by_op.allreduce / steps` (summed over all workers)
     against the ring model 2(W-1)/W x gradient_bytes per worker, i.e. 2(W-1) x gradient_bytes
     for all W workers together. Ratio must be within 5% (exit status 1 otherwise).
     krab's meter counts what the ring model says for each collective it issues
     (src/comm/backends/gloo); this check shows the trainer reduces every gradient byte exactly
     once per step and nothing else.
  2. An independent look at the wire: the loopback interface's transmit counter
     (/proc/net/dev, `lo` tx bytes, which includes TCP/IP headers, the rendezvous store and
     krab's peer monitor) read before and after the run, against the same model for the whole
     run: S x 2(W-1) x gradient_bytes + (W-1) x gradient_bytes for the initial broadcast of the
     parameters. The same is measured for PyTorch DDP (bench/ddp_peer.py) with the same W and S.
     The counter is per network namespace, so other programs using loopback at the same time
     (tests, builds) inflate it: treat it as a check, not a precise number; it is not part of
     the pass/fail decision.
Which algorithm: c10d's ProcessGroupGloo runs a dense CPU all-reduce as AsyncAllreduceWork, which
calls gloo::allreduce() without choosing an algorithm; Gloo's default (UNSPECIFIED) is its ring:
reduce-scatter then all-gather over W chunks cut into >= 2 segments each (gloo/allreduce.cc).
Every worker sends 2(W-1)/W of the buffer.

Run from the repository root, with Debian's python (the one that has torch):
  /usr/bin/python3 bench/traffic.py                  # W = 2, 3, 4; 50 steps
  /usr/bin/python3 bench/traffic.py --steps 10 --no-ddp   # quick check
Options: --workers 2,3,4  --steps 50  --krab build/bin/krab  --no-ddp  --json FILE.
Nothing is downloaded; everything runs on 127.0.0.1.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from common import REPO, krab_warmup, run_ddp, run_krab, write_cnn_job

TOLERANCE = 0.05


def loopback_tx_bytes():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])  # fields: 8 receive counters, then transmit bytes
    raise RuntimeError("no loopback interface in /proc/net/dev")


def main():
    p = argparse.ArgumentParser(description="krab traffic vs the ring all-reduce model")
    p.add_argument("--workers", default="2,3,4")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--no-ddp", action="store_true", help="skip the DDP loopback comparison")
    p.add_argument("--json", help="write every run's numbers to this file")
    args = p.parse_args()
    if not os.access(args.krab, os.X_OK):
        sys.exit(f"traffic: {args.krab} is not an executable; build krab first")

    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="krab-bench-") as tmp:
        krab = os.path.join(tmp, "krab")
        shutil.copy2(args.krab, krab)  # a snapshot: the other build may replace build/bin/krab
        job = write_cnn_job(os.path.join(tmp, "job.yaml"), "bench-traffic",
                            os.path.join(tmp, "ckpt"))
        for w in [int(x) for x in args.workers.split(",")]:
            lo0 = loopback_tx_bytes()
            r, _ = run_krab("traffic", krab, job, os.path.join(tmp, f"krab-{w}.json"),
                            [f"parallel.workers={w}", f"train.steps={args.steps}"])
            lo_krab = loopback_tx_bytes() - lo0
            grad = r["gradient_bytes"]
            steps = r["steps"]
            per_step = r["bytes_sent_by_op"]["allreduce"] / steps
            model = 2 * (w - 1) / w * grad * w
            ratio = per_step / model
            ok &= abs(ratio - 1) <= TOLERANCE
            wire_model = steps * model + (w - 1) * grad
            row = {"workers": w, "steps": steps, "gradient_bytes": grad,
                   "buckets": r.get("buckets"), "allreduce_bytes_per_step": per_step,
                   "ring_model_per_step": model, "ratio": ratio,
                   "krab_bytes_sent": r["bytes_sent"], "krab_loopback_bytes": lo_krab,
                   "wire_model": wire_model, "krab_loopback_ratio": lo_krab / wire_model}
            if not args.no_ddp:
                lo0 = loopback_tx_bytes()
                run_ddp("traffic", ["--workers", w, "--steps", args.steps,
                                    "--warmup-steps", krab_warmup(args.steps)])
                lo_ddp = loopback_tx_bytes() - lo0
                row.update({"ddp_loopback_bytes": lo_ddp, "ddp_loopback_ratio": lo_ddp / wire_model})
            rows.append(row)
            ddp_part = (f", DDP {row['ddp_loopback_ratio']:.3f}" if not args.no_ddp else "")
            print(f"W={w}: gradient {grad} B, {row['buckets']} bucket(s), allreduce/step "
                  f"{per_step:.0f} B vs ring model {model:.0f} B -> ratio {ratio:.4f}; "
                  f"loopback / model: krab {row['krab_loopback_ratio']:.3f}{ddp_part}",
                  flush=True)

    print()
    print("| W | gradient_bytes | allreduce bytes/step (krab report) | ring model 2(W-1)/W·G·W "
          "| ratio | loopback/model krab | loopback/model DDP |")
    print("|--:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ddp = f"{row['ddp_loopback_ratio']:.3f}" if "ddp_loopback_ratio" in row else "-"
        print(f"| {row['workers']} | {row['gradient_bytes']} | {row['allreduce_bytes_per_step']:.0f} "
              f"| {row['ring_model_per_step']:.0f} | {row['ratio']:.4f} "
              f"| {row['krab_loopback_ratio']:.3f} | {ddp} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    if not ok:
        print(f"traffic: FAIL: a ratio is outside 1 +- {TOLERANCE}", file=sys.stderr)
        sys.exit(1)
    print(f"traffic: OK: every ratio within 1 +- {TOLERANCE}")


if __name__ == "__main__":
    main()
