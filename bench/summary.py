#!/usr/bin/python3
"""Summary: the table of current results at the top of docs/benchmarks.md, from result files.

  python3 bench/summary.py [PATH ...]            # print the table (default PATH: bench/results)
  python3 bench/summary.py --write-doc docs/benchmarks.md   # ... and replace it in that page
  python3 bench/summary.py record FILE -- COMMAND ...       # run a benchmark, keep its output

A result file is either
  - text: one or more records, each a header of `# key: value` lines (bench, date, commit,
    cpu, command; note optional) followed by what the benchmark printed. `record` writes such
    a file: it runs COMMAND, shows its output as it goes, and writes the header (date and time
    in UTC, `git describe --always --dirty`, the CPU from /proc/cpuinfo with AVX2 / AVX-512,
    the command, the run's seconds) and the output to FILE (FILE.failed if the run failed). Only the markdown tables of the output (and slow_network's speed-up lines)
    are read, each column found by its header, so a table with fewer columns (an older
    script's, or one copied from the page) is read too;
  - JSON: what a benchmark's `--json FILE` wrote (throughput, own_model_speed, real_networks,
    accuracy,
    traffic, compression, stragglers, slow_network, federated; recognised by its shape), with
    the header keys in FILE's stem + `.meta` if there is one (`record` writes it when COMMAND
    has `--json FILE`); otherwise the date is the file's modification time and the rest
    "not recorded".
A directory stands for the *.txt and *.json files in it.

For every measure (throughput at 1 worker, fp16's traffic, the GPT's time to target at
20 Mbit/s, ...) the table takes the newest record that has it; records with the same date,
command and commit are repeats and are averaged. The peer is PyTorch DDP, or plain sync for
the compression and straggler modes, from the same run; only where slow_network's krab config
has no DDP run beside it is it paired with the newest DDP run of the same job and link, and
both runs are named. A row gathers the measures of one group
that come from the same run(s). When every row's CPU is the same it is named once, on a line
above the table (bench/all.py's one pass); otherwise each row names its own. Nothing is measured
here: it only reads files.
"""
import argparse
import os
import statistics
import sys

from record import record
from summary_records import (BENCHES, REPO, accuracy, compression, elastic_autoscale,
                             elastic_balance, elastic_kill, federated, images, num,
                             own_model_speed, read_paths, real_networks, slow_network, stragglers,
                             throughput, traffic, zero_largest, zero_memory, zero_speed)

# Reading the result files, and what each benchmark measured: summary_records.py. This file
# chooses the measures that make the table and shows them.

BEGIN = "<!-- summary.py: begin -->"
END = "<!-- summary.py: end -->"


# --- items: one measure of one run, and how it is shown -------------------------------------------

def item(kind, group, key, label, rec, values, title, peer_rec=None, split=False, pos=None):
    """`group` (with its records) decides which measures share a row; `title` is the row's
    "what", with {keys} for the labels of the measures in it; `pos` orders the measures of a
    group (default: the key)."""
    return {"kind": kind, "group": group, "key": key, "label": label, "rec": rec,
            "pos": key if pos is None else pos,
            "peer_rec": peer_rec or rec, "cross": peer_rec not in (None, rec),
            "values": values, "title": title, "split": split}


def mean(runs, k):
    xs = [r[k] for r in runs if r.get(k) is not None]
    return statistics.mean(xs) if xs else None


def pt(x):
    return f"{100 * x:+.2f} pt".replace("-", "−")


def cells(kind, runs):
    """(krab, peer or limit, krab vs peer) of one measure; `runs` are repeats of one run."""
    v = {k: mean(runs, k) for k in runs[0]}
    n = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
    if kind == "throughput":
        return (f"{v['krab']:,.0f}", f"DDP {v['ddp']:,.0f}",
                f"{v['ratio'] or v['krab'] / v['ddp']:.2f}×")
    if kind == "accuracy":
        return f"{v['krab']:.4f}", f"DDP {v['ddp']:.4f}", pt(v["krab"] - v["ddp"])
    if kind in ("own-builtin", "own-ddp"):
        peer = "built-in cnn" if kind == "own-builtin" else "DDP"
        return f"{v['krab']:,.0f}", f"{peer} {v['peer']:,.0f}", f"{v['krab'] / v['peer']:.2f}×"
    if kind == "real":
        return (f"{v['krab']:,.0f} samples/s, {v['kc']:.3f} CPU s/step",
                f"DDP {v['ddp']:,.0f} ({v['dc']:.3f}); same heap {v['heap']:,.0f} ({v['hc']:.3f})",
                f"{v['krab'] / v['ddp']:.2f}× out of the box; {v['krab'] / v['heap']:.2f}× like "
                "for like")
    if kind == "ring":
        return (f"{v['bytes']:,.0f} B", f"ring model {v['model']:,.0f} B",
                f"{v['ratio'] or v['bytes'] / v['model']:.4f}")
    if kind == "loopback":
        return (f"{v['krab']:.3f}", f"DDP {v['ddp']:.3f}", f"{v['krab'] / v['ddp']:.3f}")
    if kind == "compression":
        traffic = "" if v["traffic"] is None else f"{v['traffic']:.2f}% of sync's bytes, "
        bound = "" if v["bound"] is None else f"; bound {v['bound']:g}%"
        each = ", ".join(f"{r['acc']:.4f}" for r in runs)
        acc = f"acc. {v['acc']:.4f}{n}" + (f": {each}" if n else "")
        return traffic + acc, f"sync {v['sync']:.4f}{bound}", pt(v["acc"] - v["sync"])
    if kind == "slow":
        krab = ("not reached (final acc. " + f"{v['final']:.4f})" if v["krab"] is None
                else f"{v['krab']:,.1f} s")
        ratio = ("—" if v["krab"] is None or v["ddp"] is None
                 else f"{v['ratio'] or v['ddp'] / v['krab']:.2f}×")
        ddp = "DDP not reached" if v["ddp"] is None else f"DDP {v['ddp']:,.1f} s"
        return krab, ddp, ratio
    return cells_fl(kind, v)


def cells_fl(kind, v):
    if kind == "straggler-speed":
        return (f"{v['krab']:,.0f} samples/s ({v['krab_share']:.2f} of unslowed)",
                f"sync {v['sync']:,.0f} ({v['sync_share']:.2f} of unslowed)",
                f"{v['ratio'] or v['krab'] / v['sync']:.2f}×")
    if kind == "straggler-acc":
        return f"{v['krab']:.4f}", f"sync {v['sync']:.4f}", pt(v["krab"] - v["sync"])
    if kind == "fl-rounds":
        return (f"{v['krab']:.0f} rounds ({v['krab_s']:.0f} s)",
                f"IID {v['iid']:.0f} rounds ({v['iid_s']:.0f} s)",
                f"{v['krab'] / v['iid']:.2f}× the rounds")
    if kind == "fl-time":
        return (f"{v['secure']:.2f} s", f"plain {v['plain']:.2f} s",
                f"{v['ratio'] or v['secure'] / v['plain']:.2f}×")
    if kind == "fl-bytes":
        return (f"{v['sd']:.2f} MB down, {v['su']:.2f} MB up",
                f"plain {v['pd']:.2f} / {v['pu']:.2f} MB",
                f"{v['dr'] or v['sd'] / v['pd']:.4f} / {v['ur'] or v['su'] / v['pu']:.4f}")
    if kind == "zero-mem":
        return (f"{v['krab']:.3f} (peak RSS {v['rss']:.2f})", f"formula {v['model']:.3f}",
                f"{v['krab'] / v['model']:.3f}")
    if kind == "zero-speed":
        return (f"{v['krab']:,.0f} samples/s, {v['bytes']:,.0f} B/step",
                f"stage 0 {v['base']:,.0f}, {v['bbase']:,.0f} B/step",
                f"{v['krab'] / v['base']:.2f}× speed, {v['bytes'] / v['bbase']:.3f}× bytes")
    if kind == "zero-largest":
        ddp = "" if v["ddp"] is None else f"; DDP {v['ddp']:,.0f} M"
        vs = "" if v["ddp"] is None else f", {v['krab'] / v['ddp']:.2f}× DDP"
        return (f"{v['krab']:,.0f} M parameters", f"stage 0 {v['base']:,.0f} M{ddp}",
                f"{v['krab'] / v['base']:.2f}× stage 0{vs}")
    if kind == "images":
        return (f"{v['krab']:,.0f} samples/s, data wait {v['wait']:.2f}%",
                f"fashion-mnist {v['peer']:,.0f}; wait goal < 5%", f"{v['krab'] / v['peer']:.2f}×")
    if kind in ("kill", "balance", "autoscale"):
        return cells_elastic(kind, v)
    if kind == "fl-byz":
        failed = f" ({v['failed']:.0f} failed rounds)" if v["failed"] else ""
        return f"{v['krab']:.4f}{failed}", f"no attack {v['clean']:.4f}", pt(v["krab"] - v["clean"])
    raise ValueError(kind)


def cells_elastic(kind, v):
    if kind == "kill":
        krab = (f"{v['past']:.2f} s, {v['lost']:.0f} steps lost in {v['trials']:.0f} kills, "
                f"acc. {v['acc']:.2f}% (uninterrupted {v['base']:.2f}%)")
        if v["ppast"] is None:
            return krab, "no peer run", "—"
        return (krab, f"torchrun {v['ppast']:.2f} s, {v['plost']:.0f} steps recomputed, acc. "
                f"{v['pacc']:.2f}% (uninterrupted {v['pbase']:.2f}%)",
                f"{v['ratio'] or v['ppast'] / v['past']:.1f}× less time lost")
    if kind == "balance":
        return (f"{v['krab']:,.0f} samples/s", f"equal slices {v['equal']:,.0f}; best possible "
                f"{v['best']:.2f}×", f"{v['ratio'] or v['krab'] / v['equal']:.2f}×")
    return (f"settled at {v['at']:.0f} worker(s){'' if v['settled'] else ' (not settled)'}, "
            f"{v['krab']:,.0f} samples/s over the run",
            f"fixed size at {v['at']:.0f}: {v['fixed_at']:,.0f}; fastest fixed size "
            f"({v['best_w']:.0f}): {v['best']:,.0f}", f"{v['krab'] / v['best']:.2f}× the fastest")


SETTINGS = {"adam-cosine": "Adam lr 0.003 + cosine", "sgd-constant": "SGD lr 0.05 m 0.9"}
MODE_NAMES = {"fp16": "fp16", "bf16": "bf16", "int8": "int8", "onebit": "onebit",
              "topk": "topk 0.01", "randomk": "randomk 0.1", "powersgd": "powersgd rank 4",
              "local_sgd": "local SGD period 8", "async": "async (parameter server)",
              "async_s2": "async, max_staleness 2"}
JOBS = {"cnn": "CNN", "gpt": "GPT (next-byte)"}
IMAGE_RUNS = {"images": "default cache", "images-nocache": "data.cache_mb 1 (nearly all decoded)",
              "images+aug": "+ random crop and flip"}


def items_of(rec):
    """The measures of one record (slow_network's are paired across records later)."""
    b, out = rec.bench, []
    if b == "throughput":
        for w, k, d, ratio in throughput(rec):
            out.append(item("throughput", "throughput", w, str(w), rec,
                            {"krab": k, "ddp": d, "ratio": ratio},
                            "Throughput, CNN, samples/s after warm-up, {keys} worker(s)"))
    elif b == "own_model_speed":
        w, med = own_model_speed(rec)
        title = ("Own model: krab's cnn written in Python, TorchScript, samples/s after warm-up, "
                 f"{w} workers, vs {{keys}}")
        for i, (kind, peer, label) in enumerate((
                ("own-builtin", "builtin", "the built-in cnn"),
                ("own-ddp", "ddp", "DDP training the nn.Module"))):
            if "scripted" in med and peer in med:
                out.append(item(kind, "own-model", i, label, rec,
                                {"krab": med["scripted"], "peer": med[peer]}, title))
    elif b == "real_networks":
        w, batch, nets = real_networks(rec)
        for i, (net, got) in enumerate(nets.items()):
            if not {"krab", "ddp", "ddp-heap"} <= set(got):
                continue
            values = {"krab": got["krab"][0], "kc": got["krab"][1], "ddp": got["ddp"][0],
                      "dc": got["ddp"][1], "heap": got["ddp-heap"][0], "hc": got["ddp-heap"][1]}
            out.append(item("real", "real", net, net, rec, values,
                            "Real networks, torchvision's {keys} scripted, 3×32×32, "
                            f"{w} workers × {batch}, Adam: samples/s after warm-up, CPU s per "
                            "step (all processes); DDP out of the box and with krab's heap "
                            "settings", split=True, pos=i))
    elif b == "accuracy":
        for s, k, d in accuracy(rec):
            out.append(item("accuracy", "accuracy", s, SETTINGS.get(s, s), rec,
                            {"krab": k, "ddp": d},
                            "Test accuracy, CNN, 2 epochs, 4 workers: {keys}"))
    elif b == "traffic":
        for w, per_step, model, ratio, lo_k, lo_d in traffic(rec):
            out.append(item("ring", "ring", w, str(w), rec,
                            {"bytes": per_step, "model": model, "ratio": ratio},
                            "All-reduce bytes per step (krab's meter) vs the ring model, "
                            "W = {keys}"))
            if lo_d is not None:
                out.append(item("loopback", "loopback", w, str(w), rec,
                                {"krab": lo_k, "ddp": lo_d},
                                "Loopback bytes / ring model (the wire), W = {keys}"))
    elif b == "compression":
        out += items_compression(rec)
    elif b == "stragglers":
        out += items_stragglers(rec)
    elif b == "federated":
        out += items_federated(rec)
    elif b in ("zero_memory", "zero_speed"):
        out += items_zero(rec)
    elif b == "zero_largest":
        out += items_largest(rec)
    elif b.startswith("elastic_"):
        out += items_elastic(rec)
    elif b == "images":
        got = images(rec)
        base = got.get("fashion-mnist", (None, None))[0]
        out += [item("images", "images", k, IMAGE_RUNS.get(k, k), rec,
                     {"krab": sps, "wait": wait, "peer": base},
                     "PNG folder decoded per batch, CNN, 2 workers, samples/s and data wait vs "
                     "built-in Fashion-MNIST: {keys}", split=True, pos=i)
                for i, (k, (sps, wait)) in enumerate(got.items())
                if k != "fashion-mnist" and base and sps is not None and wait is not None]
    return out


def items_zero(rec):
    """ZeRO: the widest GPT's model state per rank against the formula, stages 0-2(3); and
    samples/s and bytes per step of each stage against stage 0, per model and worker count."""
    if rec.bench == "zero_memory":
        got = zero_memory(rec)
        if not got:
            return []
        width = max(w for w, *_ in got)
        return [item("zero-mem", "zero-mem", st, str(st), rec,
                     {"krab": m, "model": p, "rss": rss},
                     f"ZeRO model state per rank (GiB), GPT width {width}, 4 layers, 4 workers, "
                     "Adam, stage {keys}: measured vs the ZeRO formula; peak RSS per rank")
                for w, st, m, p, rss in got if w == width and m is not None]
    out = []
    for (model, w), stages in zero_speed(rec).items():
        base = stages.get(0)
        for st, (rate, per_step) in sorted(stages.items()):
            if st == 0 or base is None:
                continue
            out.append(item("zero-speed", f"zero-speed-{model}-{w}", st, str(st), rec,
                            {"krab": rate, "base": base[0], "bytes": per_step, "bbase": base[1]},
                            f"ZeRO {JOBS.get(model, model)}, {w} workers, samples/s after "
                            "warm-up and bytes per step, stage {keys} vs stage 0"))
    return out


def items_largest(rec):
    """ZeRO: the largest GPT that trained with capped workers, each krab run kind against
    krab's stage 0 and PyTorch DDP of the same run."""
    cap, got = zero_largest(rec)
    params = {run: p for run, p, _ in got}
    base, ddp = params.get("krab stage 0"), params.get("PyTorch DDP (Gloo)")
    if not base:
        return []
    return [item("zero-largest", "zero-largest", i, f"{run} ({size})", rec,
                 {"krab": p, "base": base, "ddp": ddp},
                 f"Largest GPT that trains (20 steps, loss down), 4 workers, each capped at "
                 f"{cap:g} GiB in its own cgroup: {{keys}}", split=True)
            for i, (run, p, size) in enumerate(got)
            if p is not None and run.startswith("krab") and run != "krab stage 0"]


def items_elastic(rec):
    """The elastic benchmarks: a kill's time lost against torchrun's restart from a checkpoint;
    balanced against equal slices with a straggler; where autoscaling settles against the
    fixed-size runs."""
    if rec.bench == "elastic_kill":
        k = elastic_kill(rec)
        if k["krab"] is None:
            return []
        peer = k["peer"] or (None,) * 4
        zero = f" at ZeRO stage {k['zero_stage']}" if k["zero_stage"] else ""
        vs = "; torchrun restarting from a checkpoint on the same kills" if k["peer"] else ""
        return [item("kill", f"kill-{k['zero_stage']}-{k['workers']}", 0, "", rec, dict(
            zip(("past", "lost", "acc", "base", "ppast", "plost", "pacc", "pbase"),
                k["krab"] + tuple(peer)), trials=k["trials"], ratio=k["ratio"]),
            f"Elastic run{zero}, CNN, {k['workers']} workers, {k['epochs']} epoch(s) = "
            f"{k['steps']} steps: kill -9 of a "
            f"random worker at a random step: median time lost (kill → past the kill step), "
            f"steps lost, accuracy{vs}")]
    if rec.bench == "elastic_balance":
        w, got = elastic_balance(rec)
        return [item("balance", f"balance-{w}", i, f"{who} (last split {split})", rec,
                     {"krab": bal, "equal": eq, "ratio": ratio, "best": best},
                     f"Load balancing (elastic.balance auto), CNN, {w} workers × 64, samples/s, "
                     "balanced vs equal slices, straggler {keys}", split=True)
                for i, (who, eq, bal, ratio, best, split) in enumerate(got)
                if eq is not None and bal is not None]
    a = elastic_autoscale(rec)
    if not a["fixed"]:
        return []
    best_w = max(a["fixed"], key=a["fixed"].get)
    return [item("autoscale", "autoscale", i, provider, rec,
                 {"at": at, "settled": ok, "krab": sps, "fixed_at": a["fixed"].get(at),
                  "best_w": best_w, "best": a["fixed"][best_w]},
                 f"Autoscaling from 1 worker, max {a['max']}, CNN, global batch 256: where "
                 "it settles and samples/s over the run, vs fixed-size runs, provider {keys}",
                 split=True)
            for i, (provider, (at, ok, sps, _)) in enumerate(a["runs"].items())
            if at in a["fixed"]]


def items_compression(rec):
    modes = compression(rec)
    if "sync" not in modes:
        return []
    sync = modes["sync"][0]
    order = list(MODE_NAMES)
    return [item("compression", "compression", m, MODE_NAMES.get(m, m), rec,
                 {"acc": acc, "sync": sync, "traffic": traffic, "bound": bound},
                 "{keys} vs plain sync (krab), CNN, 2 epochs, 4 workers: traffic, test acc.",
                 split=True, pos=(order.index(m) if m in order else len(order), m))
            for m, (acc, traffic, bound) in modes.items() if m != "sync"]


def items_stragglers(rec):
    got = stragglers(rec)
    if not got or "async" not in got[2] or "sync" not in got[2]:
        return []
    early, late, modes = got
    a, s = modes["async"], modes["sync"]
    title = "One of 4 workers slowed 3×, CNN: {keys}"
    return [
        item("straggler-speed", "stragglers", 0, "async (unbounded) vs sync, samples/s", rec,
             {"krab": a[0], "krab_share": a[1], "sync": s[0], "sync_share": s[1],
              "ratio": a[4]}, title,
             split=True),
        item("straggler-acc", "stragglers", 1, f"test acc. at {early:.0f} s (async done), "
             "async vs sync", rec, {"krab": a[2], "sync": s[2]}, title, split=True),
        item("straggler-acc", "stragglers", 2, f"test acc. at {late:.0f} s (sync done), "
             "async vs sync", rec, {"krab": a[3], "sync": s[3]}, title, split=True)]


def items_federated(rec):
    f, out = federated(rec), []
    iid = next((v for k, v in f["rounds"].items() if k.lower().startswith("iid")), None)
    for label, (n, wall) in f["rounds"].items():
        if iid and not label.lower().startswith("iid") and n and iid[0]:
            out.append(item("fl-rounds", "fl-rounds", label, label, rec,
                            {"krab": n, "krab_s": wall, "iid": iid[0], "iid_s": iid[1]},
                            f"FedAvg (fl-sim), 100 clients, 10 a round: rounds to "
                            f"{f['target']:.2f} test acc., {{keys}} vs IID"))
    for steps, by_n in sorted(f["time"].items()):
        for n, (plain, secure, ratio) in sorted(by_n.items()):
            out.append(item("fl-time", f"fl-time-{steps}", n, str(n), rec,
                            {"plain": plain, "secure": secure, "ratio": ratio},
                            f"Secure aggregation, s/round, local_steps {steps}, "
                            "{keys} clients"))
    for n, (pd, sd, pu, su, dr, ur) in sorted(f["bytes"].items()):
        out.append(item("fl-bytes", "fl-bytes", n, str(n), rec,
                        {"pd": pd, "sd": sd, "pu": pu, "su": su, "dr": dr, "ur": ur},
                        "Secure aggregation, bytes per round (down / up), {keys} clients"))
    clean = next((v for k, v in f["byz"].items() if "no attack" in k), None)
    for i, (label, acc) in enumerate(f["byz"].items()):
        if clean is not None and "no attack" not in label:
            out.append(item("fl-byz", "fl-byz", label, label, rec,
                            {"krab": acc, "clean": clean, "failed": f["failed"].get(label, 0)},
                            "30% byzantine clients (×−4), test acc. after the last round: "
                            "{keys}", pos=(i, label)))
    return out


def items_slow(records):
    """Time to target of every krab config at every link, beside DDP's at that link: from the
    same run where there is one, else the newest DDP run of the same job at that link."""
    runs = []
    for rec in records:
        job, target, rs = slow_network(rec)
        runs += [(job, target, link, system, t, final, rec, up)
                 for link, system, t, final, up in rs]
    out = []
    for job, target, link, system, t, final, rec, up in runs:
        if system == "ddp":
            continue
        ddps = [r for r in runs if r[3] == "ddp" and r[0] == job and r[2] == link]
        same = [r for r in ddps if r[6] is rec]
        peer = same[0] if same else max(ddps, key=lambda r: r[6].when(), default=None)
        if peer is None:
            continue
        name = "fp32" if system in ("krab", "krab:none") else system.split(":", 1)[-1]
        out.append(item("slow", f"slow-{job}-{system}", link_order(link), link, rec,
                        {"krab": t, "final": final, "ddp": peer[4],
                         "ratio": up if peer[6] is rec else None},
                        f"{JOBS.get(job, job)} time to {target:g} test acc., 4 namespaces, krab "
                        f"{name} vs DDP fp32, {{keys}}", peer_rec=peer[6]))
    return out


def link_order(link):
    rate = num(link)
    return -1.0 if rate is None else 1e6 - rate  # unshaped first, then the fastest link


# --- the table ------------------------------------------------------------------------------------

def select(items):
    """Per (group, key): the repeats of the newest run, a same-run pair before a cross-run one."""
    best = {}
    for it in items:
        k = (it["group"], it["key"])
        rank = (not it["cross"], it["rec"].when(), it["peer_rec"].when())
        if k not in best or rank > best[k][0]:
            best[k] = (rank, [it])
        elif rank == best[k][0] and it["rec"].same_run_as(best[k][1][0]["rec"]):
            best[k][1].append(it)
    return [runs for _, runs in best.values()]


def rows(items):
    """Markdown rows: the selected measures of a group that come from the same run(s) share
    one row, in the order the benchmarks are listed, measures in key order."""
    chosen = select(items)
    first = {}
    for i, it in enumerate(items):
        first.setdefault(it["group"], i)
    chosen.sort(key=lambda runs: (first[runs[0]["group"]], runs[0]["pos"]))
    grouped = {}
    for runs in chosen:
        it = runs[0]
        key = (it["group"], id(it["rec"]), id(it["peer_rec"]),
               it["key"] if it["split"] else None)
        grouped.setdefault(key, []).append(runs)
    return [row(measures) for measures in grouped.values()]


def joined(values):
    return values[0] if len(set(values)) == 1 else "; ".join(values)


def shown_or_gap(runs):
    """cells(), or dashes and a warning where the output lacks a number the cell needs (a
    short --quick run, a run that stopped early): one odd record must not cost the table."""
    try:
        return cells(runs[0]["kind"], [r["values"] for r in runs])
    except (TypeError, ZeroDivisionError) as e:
        print(f"summary: {runs[0]['rec'].source}: a {runs[0]['kind']} measure lacks a number "
              f"({e}); shown as —", file=sys.stderr)
        return "—", "—", "—"


def row(measures):
    it = measures[0][0]
    shown = [shown_or_gap(runs) for runs in measures]
    what = it["title"].format(keys="; ".join(runs[0]["label"] for runs in measures))
    recs = [it["rec"]] if not it["cross"] else [it["rec"], it["peer_rec"]]
    tag = ["", ""] if len(recs) == 1 else ["krab: ", "DDP: "]

    def meta(k):
        if len(recs) == 1 or recs[0].get(k) == recs[1].get(k):
            return recs[0].get(k)
        return "; ".join(tag[i] + r.get(k) for i, r in enumerate(recs))
    command = "; ".join(f"{tag[i]}`{r.get('command')}`" for i, r in enumerate(recs)) \
        if recs[0].get("command") != recs[-1].get("command") else f"`{recs[0].get('command')}`"
    krab, peer, ratio = ([s[i] for s in shown] for i in range(3))
    return [what, "; ".join(krab), joined(peer), "; ".join(ratio), meta("cpu"),
            meta("commit"), meta("date"), command]


HEADER = ["what", "krab", "peer or limit", "krab vs peer", "CPU", "commit", "date",
          "command"]
CPU = HEADER.index("CPU")


def table(records):
    """The markdown table; when every row was measured on the same CPU it is named once, on a
    line above the table, instead of in a column repeated on every row."""
    slow = [r for r in records if r.bench == "slow_network"]
    items = [it for r in records if r.bench != "slow_network" for it in items_of(r)]
    items += items_slow(slow)
    order = {b: i for i, b in enumerate(BENCHES)}
    # Stable: records keep their order, but for the elastic groups (data parallel before
    # ZeRO stage 3, 2 workers before 4), which would otherwise follow the files' names.
    items.sort(key=lambda it: (order[it["rec"].bench],
                               it["group"] if it["kind"] in ("kill", "balance") else ""))
    body, head, lead = rows(items), list(HEADER), []
    cpus = {r[CPU] for r in body}
    if len(cpus) == 1:
        lead = [f"Every row: {cpus.pop()}.", ""]
        body, head = [r[:CPU] + r[CPU + 1:] for r in body], head[:CPU] + head[CPU + 1:]
    align = ["---"] * len(head)
    align[head.index("krab vs peer")] = "---:"
    lines = lead + ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body]
    return "\n".join(lines)


# --- record, write, main --------------------------------------------------------------------------

def write_doc(path, text):
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"summary: {path} has no '{BEGIN}' ... '{END}' block to replace")
    head, rest = doc.split(BEGIN, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def main(argv):
    if argv[:1] == ["record"]:
        p = argparse.ArgumentParser(prog="summary.py record",
                                    description="run a benchmark and keep its output as a "
                                    "result file (with date, commit, CPU and command)")
        p.add_argument("--note", help="a `# note:` line for the header (bench/all.py --quick: "
                       "\"quick\", which --write-doc refuses)")
        p.add_argument("file")
        p.add_argument("command", nargs=argparse.REMAINDER,
                       help="-- then the benchmark's command line")
        a = p.parse_args(argv[1:])
        command = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not command:
            p.error("no command after the file")
        return record(a.file, command, a.note)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", default=[os.path.join(REPO, "bench", "results")],
                   help="result files or directories (default: bench/results)")
    p.add_argument("--write-doc", metavar="MD",
                   help=f"also replace the table between '{BEGIN}' and '{END}' in MD")
    a = p.parse_args(argv)
    records = read_paths(a.paths)
    if not records:
        sys.exit("summary: no records in " + ", ".join(a.paths))
    text = table(records)
    print(text)
    quick = sorted({r.source for r in records if r.meta.get("note", "").startswith("quick")})
    if a.write_doc and quick:
        sys.exit(f"summary: not writing {a.write_doc}: smoke-test records (note: quick) in "
                 + ", ".join(quick))
    if a.write_doc:
        write_doc(a.write_doc, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
