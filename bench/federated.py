#!/usr/bin/python3
"""Federated learning with `krab fl-sim`: rounds to a target accuracy, the cost of secure
aggregation, and robust aggregators under a byzantine attack.

Every run is `krab fl-sim examples/fed_fmnist.yaml --clients N --set ... --report FILE`: the
CNN on Fashion-MNIST (/usr/share/datasets/fashion-mnist), clients training one after another
in one process with 1 intra-op thread (train.threads_per_worker 1), local SGD lr 0.05 without
momentum, batch 32 (the example job), each run in its own temporary checkpoint directory.

  1. Rounds to --target (0.80) test accuracy, FedAvg, 100 clients, 10 per round (fraction 0.1),
     1 local epoch: non-IID (federated.partition classes, 2 label shards per client) and IID.
     The global model is evaluated on the whole test split every --eval-every rounds (1: exact
     round counts). A run goes in chunks of --chunk rounds with checkpoint.resume true (the
     resumed run continues exactly where the last one stopped) and stops at the first chunk
     that reaches the target, or at --max-rounds (non-IID) / --iid-max-rounds. Reported: the
     first round at or above the target, the wall time to it (the rounds' own `seconds`,
     training + aggregation + evaluation, summed up to that round; process start-up left out),
     and the bytes per round each way.
  2. Secure aggregation (federated.secure_aggregation true) against plain FedAvg at 10, 50 and
     100 clients per round (--clients N with fraction 1.0, IID): time per round and bytes per
     round down and up, secure / plain. Each run has --sa-rounds timed rounds plus a last one
     that is evaluated and not timed; the time is the median of the timed rounds. Two settings:
     federated.local_steps 2 (the round is mostly model transfer and aggregation; --sa-repeats
     runs per mode, alternating plain and secure) and --sa-train-steps 19 local steps (one epoch
     of a 600-example shard at batch 32, as in part 1: a training-included round;
     --sa-train-repeats runs per mode). The bytes are checked against the message sizes of
     src/federated/secagg.h.
  3. Robustness: 30% of the 100 clients byzantine (federated.sim_byzantine_fraction 0.3; they
     send -4 x their true update, federated.sim_attack_scale), IID partition, 10 per round,
     --byz-rounds (30) rounds: test accuracy (every --byz-eval-every rounds and at the end) for
     aggregator mean (plain FedAvg), median, trimmed_mean (trim_beta 0.3) and krum
     (byzantine_f 3: 3 of 10 expected per round; krum needs n > 2f + 2, so f <= 3 for 10),
     beside mean without attackers.

Run from the repository root with Debian's python:
  /usr/bin/python3 bench/federated.py                   # all three parts (~40 min)
  /usr/bin/python3 bench/federated.py --only 2          # one part
  /usr/bin/python3 bench/federated.py --quick           # smoke check (a few rounds, ~4 min)
Options: --krab build/bin/krab  --json FILE (every report and summary)  --target 0.80
  --max-rounds 200 --iid-max-rounds 100 --chunk 20 --eval-every 1 --lr 0.05
  --sa-clients 10,50,100 --sa-rounds 3 --sa-repeats 2 --sa-train-steps 19 --sa-train-repeats 1
  --byz-rounds 30 --byz-eval-every 5 --byz-fraction 0.3 --attack-scale 4 --trim-beta 0.3
  --krum-f 3
It copies the krab binary to a temporary directory first. Exit status 1 if a run fails or a
report contradicts itself (a failed round in part 3 is a result, not a failure, and is shown).
Nothing is downloaded; nothing uses the network.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import REPO, fail, machine_load

JOB = os.path.join(REPO, "examples", "fed_fmnist.yaml")
DATA = "/usr/share/datasets/fashion-mnist"
MB = 1e6

problems = []  # reports that contradict themselves; the script exits 1 if there are any


def problem(msg):
    print(f"  PROBLEM: {msg}", flush=True)
    problems.append(msg)


class Runner:
    def __init__(self, krab, tmp, lr):
        self.krab, self.tmp, self.lr = krab, tmp, lr
        self.commands = []

    def run(self, tag, clients, sets, ckpt=None):
        """One `krab fl-sim` process; exits on failure. Returns (report, process seconds)."""
        ckpt = ckpt or os.path.join(self.tmp, tag)
        report = os.path.join(self.tmp, tag + ".json")
        sets = [f"name=fl-bench-{tag}", f"checkpoint.dir={ckpt}", f"data.path={DATA}",
                "train.threads_per_worker=1", f"train.optimizer.lr={self.lr}"] + sets
        cmd = [self.krab, "fl-sim", JOB, "--clients", str(clients), "--report", report]
        for s in sets:
            cmd += ["--set", s]
        load, compilers = machine_load()
        self.commands.append(" ".join(cmd))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or not os.path.exists(report):
            fail("federated", cmd, proc)
        with open(report) as f:
            r = json.load(f)
        os.remove(report)
        r["_load"], r["_compilers"], r["_process_seconds"] = load, compilers, elapsed
        check_report(tag, r, clients)
        return r, elapsed


def check_report(tag, r, clients):
    """What must hold in every report: rounds numbered 1..R, totals equal to the rounds' sum,
    one client's example count per client adding up to the training split."""
    rounds = r["rounds"]
    if [x["round"] for x in rounds] != list(range(1, len(rounds) + 1)):
        problem(f"{tag}: rounds are not numbered 1..{len(rounds)}")
    for key in ("bytes_down", "bytes_up"):
        if r[key] != sum(x[key] for x in rounds):
            problem(f"{tag}: {key} {r[key]} is not the sum over the rounds")
    if len(r["client_examples"]) != clients or sum(r["client_examples"]) != 60000:
        problem(f"{tag}: client_examples: {len(r['client_examples'])} clients, "
                f"{sum(r['client_examples'])} examples (want {clients}, 60000)")
    if rounds and "test_accuracy" not in rounds[-1]:
        problem(f"{tag}: the last round was not evaluated")


def failed_rounds(r):
    return [(x["round"], x.get("failure", "")) for x in r["rounds"] if not x["ok"]]


def load_note(reports):
    loads = [x["_load"] for x in reports]
    comp = max(x["_compilers"] for x in reports)
    return f"load average {min(loads):.1f}-{max(loads):.1f}, up to {comp} compiler processes"


# ---- 1. rounds to the target -------------------------------------------------------------

def part1(run, a):
    print(f"\n1. FedAvg rounds to {a.target:.2f} test accuracy: 100 clients, 10 per round, "
          f"1 local epoch, lr {a.lr}, eval every {a.eval_every} round(s)", flush=True)
    settings = [("non-IID (2 classes per client)", "noniid",
                 ["federated.partition=classes", "federated.classes_per_client=2"], a.max_rounds),
                ("IID", "iid", ["federated.partition=iid"], a.iid_max_rounds)]
    out = {}
    for label, tag, psets, cap in settings:
        ckpt = os.path.join(run.tmp, "p1-" + tag)
        done, process_s, chunks, r = 0, 0.0, 0, None
        while True:
            upto = min(cap, done + a.chunk)
            sets = psets + ["federated.fraction=0.1", f"federated.rounds={upto}",
                            f"federated.eval_every={a.eval_every}", "checkpoint.resume=true"]
            r, elapsed = run.run(f"p1-{tag}-{upto}", 100, sets, ckpt=ckpt)
            process_s += elapsed
            chunks += 1
            if len(r["rounds"]) != upto:
                problem(f"p1 {tag}: resumed report has {len(r['rounds'])} rounds, want {upto}")
            evals = [(x["round"], x["test_accuracy"]) for x in r["rounds"] if "test_accuracy" in x]
            hit = next((n for n, acc in evals if acc >= a.target), None)
            best = max(acc for _, acc in evals)
            print(f"  {tag}: rounds {done + 1}-{upto}: accuracy {evals[-1][1]:.4f} at round "
                  f"{evals[-1][0]}, best so far {best:.4f} ({elapsed:.0f} s, load "
                  f"{r['_load']:.1f})", flush=True)
            if hit is not None or upto >= cap:
                break
            done = upto
        rounds = r["rounds"]
        last = hit if hit is not None else len(rounds)
        wall = sum(x["seconds"] for x in rounds[:last])
        res = {
            "label": label, "cap": cap, "rounds_to_target": hit,
            "accuracy_at": dict(evals)[last] if last in dict(evals) else None,
            "best_accuracy": best, "best_round": max(evals, key=lambda e: e[1])[0],
            "wall_seconds_to_target": wall if hit is not None else None,
            "wall_seconds_run": sum(x["seconds"] for x in rounds),
            "process_seconds": process_s, "chunks": chunks,
            "seconds_per_round": statistics.median(x["seconds"] for x in rounds),
            "mb_down_per_round": statistics.median(x["bytes_down"] for x in rounds) / MB,
            "mb_up_per_round": statistics.median(x["bytes_up"] for x in rounds) / MB,
            "failed_rounds": failed_rounds(r), "accuracy_curve": evals, "report": r,
        }
        if res["failed_rounds"]:
            problem(f"p1 {tag}: failed rounds {res['failed_rounds']}")
        out[tag] = res

    print(f"\n| partition | rounds to {a.target:.2f} | wall time to {a.target:.2f} | "
          f"s/round (median) | MB down / round | MB up / round | best accuracy (round) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for res in out.values():
        n = res["rounds_to_target"]
        reached = str(n) if n else f"not in {res['cap']}"
        wall = f"{res['wall_seconds_to_target']:.0f} s" if n else "—"
        print(f"| {res['label']} | {reached} | {wall} | "
              f"{res['seconds_per_round']:.2f} | {res['mb_down_per_round']:.2f} | "
              f"{res['mb_up_per_round']:.2f} | {res['best_accuracy']:.4f} ({res['best_round']}) |")
    print(f"({load_note([x['report'] for x in out.values()])} at the last chunk of each run)")
    return out


# ---- 2. secure aggregation ---------------------------------------------------------------

def secagg_bytes(n, m):
    """Bytes per round (down, up) that the message sizes of src/federated/secagg.h and the
    16-byte per-message framing of rounds.cpp give for n clients and m parameters, nobody
    dropping out: the model down and AdvertiseKeys up with the fit, then Roster, IncomingShares
    and UnmaskRequest down, ShareKeys, MaskedInput (60 + 4m: the masked vector and the 32-byte
    commitment to the self-mask seed) and UnmaskResponse up."""
    down = n * 4 * m + n * (16 + 72 * n + 16) + n * (24 + 196 * (n - 1) + 16) + n * (20 + 8 * n + 16)
    up = n * (84 + 16) + n * (24 + 196 * (n - 1) + 16) + n * (60 + 4 * m + 16) + n * (28 + 68 * n + 16)
    return down, up


def plain_bytes(n, m):
    return n * 4 * m, n * (4 * m + 16)


def part2(run, a):
    sizes = [int(x) for x in a.sa_clients.split(",")]
    print(f"\n2. Secure aggregation vs plain: fraction 1.0, IID, {a.sa_rounds} timed round(s) per "
          f"run", flush=True)
    out = {"local_steps_2": {}, f"local_steps_{a.sa_train_steps}": {}}
    for key, steps, repeats in (("local_steps_2", 2, a.sa_repeats),
                                (f"local_steps_{a.sa_train_steps}", a.sa_train_steps,
                                 a.sa_train_repeats)):
        for n in sizes:
            runs = {False: [], True: []}
            for rep in range(repeats):
                for secure in (False, True):
                    tag = f"p2-s{steps}-n{n}-{'secure' if secure else 'plain'}-{rep}"
                    sets = ["federated.partition=iid", "federated.fraction=1.0",
                            f"federated.min_clients={min(n, 5)}",
                            f"federated.local_steps={steps}",
                            f"federated.rounds={a.sa_rounds + 1}",
                            f"federated.eval_every={10 ** 6}",
                            f"federated.secure_aggregation={'true' if secure else 'false'}"]
                    r, elapsed = run.run(tag, n, sets)
                    timed = r["rounds"][:a.sa_rounds]
                    t = statistics.median(x["seconds"] for x in timed)
                    if failed_rounds(r):
                        problem(f"{tag}: failed rounds {failed_rounds(r)}")
                    for x in r["rounds"]:
                        if len(x["counted"]) != n or x["dropped"] or x["rejected"]:
                            problem(f"{tag}: round {x['round']} counted {len(x['counted'])} of {n}")
                    runs[secure].append({"seconds_per_round": t, "round_seconds":
                                         [x["seconds"] for x in r["rounds"]],
                                         "bytes_down": timed[0]["bytes_down"],
                                         "bytes_up": timed[0]["bytes_up"],
                                         "test_accuracy": r["test_accuracy"],
                                         "mean_loss_last": r["rounds"][-1]["mean_loss"],
                                         "load": r["_load"], "compilers": r["_compilers"],
                                         "parameters": r["parameters"]})
                    print(f"  local_steps {steps:>2}, {n:>3} clients, "
                          f"{'secure' if secure else 'plain '}: {t:6.2f} s/round, "
                          f"{timed[0]['bytes_down'] / MB:7.2f} MB down, "
                          f"{timed[0]['bytes_up'] / MB:7.2f} MB up, accuracy "
                          f"{r['test_accuracy']:.4f} ({elapsed:.0f} s, load {r['_load']:.1f})",
                          flush=True)
            m = runs[False][0]["parameters"]
            res = {"plain": runs[False], "secure": runs[True]}
            for mode, want in (("plain", plain_bytes(n, m)), ("secure", secagg_bytes(n, m))):
                got = {(x["bytes_down"], x["bytes_up"]) for x in res[mode]}
                res[mode + "_bytes_match_model"] = got == {want}
                if got != {want}:
                    problem(f"p2 {mode} {n} clients: bytes {got} per round, the message sizes "
                            f"give {want}")
            res["t_plain"] = statistics.median(x["seconds_per_round"] for x in runs[False])
            res["t_secure"] = statistics.median(x["seconds_per_round"] for x in runs[True])
            out[key][n] = res

    for key, res_by_n in out.items():
        steps = key.rsplit("_", 1)[1]
        print(f"\nlocal_steps {steps}:")
        print("| clients / round | plain s/round | secure s/round | time secure/plain | "
              "extra s per client | MB down plain → secure | down ratio | MB up plain → secure "
              "| up ratio | accuracy plain / secure |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, res in res_by_n.items():
            p, s = res["plain"][0], res["secure"][0]
            print(f"| {n} | {res['t_plain']:.2f} | {res['t_secure']:.2f} | "
                  f"{res['t_secure'] / res['t_plain']:.2f} | "
                  f"{(res['t_secure'] - res['t_plain']) / n:.3f} | "
                  f"{p['bytes_down'] / MB:.2f} → {s['bytes_down'] / MB:.2f} | "
                  f"{s['bytes_down'] / p['bytes_down']:.4f} | "
                  f"{p['bytes_up'] / MB:.2f} → {s['bytes_up'] / MB:.2f} | "
                  f"{s['bytes_up'] / p['bytes_up']:.4f} | "
                  f"{p['test_accuracy']:.4f} / {s['test_accuracy']:.4f} |")
    ok = all(res[m + "_bytes_match_model"] for r in out.values() for res in r.values()
             for m in ("plain", "secure"))
    print(f"bytes equal to the protocol's message sizes in every run: {'yes' if ok else 'NO'}")
    return out


# ---- 3. robustness -----------------------------------------------------------------------

def part3(run, a):
    print(f"\n3. Robust aggregation: 100 clients (IID), 10 per round, {a.byz_rounds} rounds, "
          f"{a.byz_fraction:.0%} byzantine sending -{a.attack_scale:g} x their update", flush=True)
    attack = [f"federated.sim_byzantine_fraction={a.byz_fraction}",
              f"federated.sim_attack_scale={a.attack_scale}"]
    configs = [
        ("mean, no attack", ["federated.aggregator=mean"]),
        ("mean (FedAvg)", ["federated.aggregator=mean"] + attack),
        ("median", ["federated.aggregator=median"] + attack),
        (f"trimmed_mean β={a.trim_beta:g}", ["federated.aggregator=trimmed_mean",
                                            f"federated.trim_beta={a.trim_beta}"] + attack),
        (f"krum f={a.krum_f}", ["federated.aggregator=krum",
                                f"federated.byzantine_f={a.krum_f}"] + attack),
    ]
    out = {}
    for i, (label, sets) in enumerate(configs):
        sets = ["federated.partition=iid", "federated.fraction=0.1",
                f"federated.rounds={a.byz_rounds}",
                f"federated.eval_every={a.byz_eval_every}"] + sets
        r, elapsed = run.run(f"p3-{i}", 100, sets)
        evals = {x["round"]: x["test_accuracy"] for x in r["rounds"] if "test_accuracy" in x}
        res = {"label": label, "sets": sets, "accuracy": evals,
               "final_accuracy": r["test_accuracy"], "failed_rounds": failed_rounds(r),
               "rejected": sum(len(x["rejected"]) for x in r["rounds"]),
               "seconds_per_round": statistics.median(x["seconds"] for x in r["rounds"]),
               "mean_loss_last": r["rounds"][-1]["mean_loss"], "load": r["_load"],
               "report": r}
        out[label] = res
        print(f"  {label:<22} accuracy {r['test_accuracy']:.4f} after {a.byz_rounds} rounds, "
              f"{len(res['failed_rounds'])} failed round(s), {res['rejected']} rejected update(s) "
              f"({elapsed:.0f} s, load {r['_load']:.1f})", flush=True)
        for n, why in res["failed_rounds"][:3]:
            print(f"    round {n} failed: {why}")
    marks = sorted(next(iter(out.values()))["accuracy"])
    print("\n| aggregator | attack | " + " | ".join(f"acc. round {n}" for n in marks)
          + " | failed rounds | rejected updates | s/round |")
    print("|---|---|" + "---:|" * (len(marks) + 3))
    for res in out.values():
        attacked = "none" if "no attack" in res["label"] else f"{a.byz_fraction:.0%}, ×−{a.attack_scale:g}"
        accs = " | ".join(f"{res['accuracy'].get(n, float('nan')):.4f}" for n in marks)
        print(f"| {res['label']} | {attacked} | {accs} | {len(res['failed_rounds'])} | "
              f"{res['rejected']} | {res['seconds_per_round']:.2f} |")
    return out


def main():
    p = argparse.ArgumentParser(description="krab fl-sim: rounds to accuracy, secure aggregation "
                                "cost, robust aggregators under attack")
    p.add_argument("--only", choices=["1", "2", "3"], help="run one part")
    p.add_argument("--quick", action="store_true", help="a few rounds of each part (smoke check)")
    p.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    p.add_argument("--json", help="write every report and summary here")
    p.add_argument("--lr", type=float, default=0.05, help="local SGD learning rate (all parts)")
    p.add_argument("--target", type=float, default=0.80)
    p.add_argument("--max-rounds", type=int, default=200, help="part 1 cap, non-IID")
    p.add_argument("--iid-max-rounds", type=int, default=100, help="part 1 cap, IID")
    p.add_argument("--chunk", type=int, default=20, help="part 1 rounds per process")
    p.add_argument("--eval-every", type=int, default=1, help="part 1 evaluation period")
    p.add_argument("--sa-clients", default="10,50,100")
    p.add_argument("--sa-rounds", type=int, default=3)
    p.add_argument("--sa-repeats", type=int, default=2)
    p.add_argument("--sa-train-steps", type=int, default=19)
    p.add_argument("--sa-train-repeats", type=int, default=1)
    p.add_argument("--byz-rounds", type=int, default=30)
    p.add_argument("--byz-eval-every", type=int, default=5)
    p.add_argument("--byz-fraction", type=float, default=0.3)
    p.add_argument("--attack-scale", type=float, default=4)
    p.add_argument("--trim-beta", type=float, default=0.3)
    p.add_argument("--krum-f", type=int, default=3)
    a = p.parse_args()
    if a.quick:
        a.max_rounds, a.iid_max_rounds, a.chunk = 4, 3, 2
        a.sa_clients, a.sa_rounds, a.sa_repeats, a.sa_train_steps = "5,10", 1, 1, 4
        a.byz_rounds, a.byz_eval_every = 3, 1
    if not os.access(a.krab, os.X_OK):
        sys.exit(f"federated: {a.krab} is not an executable; build krab first")

    results = {"args": vars(a)}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="krab-federated-") as tmp:
        run = Runner(shutil.copy(a.krab, os.path.join(tmp, "krab")), tmp, a.lr)
        parts = [a.only] if a.only else ["1", "2", "3"]
        for part in parts:
            t = time.time()
            results["part" + part] = {"1": part1, "2": part2, "3": part3}[part](run, a)
            print(f"(part {part}: {time.time() - t:.0f} s)", flush=True)
        results["commands"] = run.commands
    results["seconds"] = time.time() - t0
    results["problems"] = problems
    print(f"\ntotal {results['seconds'] / 60:.1f} min; first command: {run.commands[0]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if problems:
        print(f"{len(problems)} problem(s):\n  " + "\n  ".join(problems))
        sys.exit(1)


if __name__ == "__main__":
    main()
