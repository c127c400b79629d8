#!/usr/bin/python3
"""Summary: the table of current results at the top of docs/benchmarks.md, from result files.

  python3 bench/summary.py [PATH ...]            # print the table (default PATH: bench/results)
  python3 bench/summary.py --write-doc docs/benchmarks.md   # ... and replace it in that page
  python3 bench/summary.py record FILE -- COMMAND ...       # run a benchmark, keep its output

A result file is either
  - text: one or more records, each a header of `# key: value` lines (bench, date, commit,
    cpu, command; note optional) followed by what the benchmark printed. `record` writes such
    a file: it runs COMMAND, shows its output as it goes, and writes the header (date and time
    in UTC, `git describe --always --dirty`, the CPU from /proc/cpuinfo, the command) and the
    output to FILE. Only the markdown tables of the output (and slow_network's speed-up lines)
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
that come from the same run(s). Nothing is measured here: it only reads files.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- summary.py: begin -->"
END = "<!-- summary.py: end -->"
BENCHES = ("throughput", "own_model_speed", "real_networks", "accuracy", "traffic", "compression",
           "slow_network", "stragglers", "federated", "images")


# --- records --------------------------------------------------------------------------------------

class Record:
    """One benchmark run: its header (bench, date, commit, cpu, command, note) and either the
    tables it printed or the JSON it wrote."""

    def __init__(self, meta, source, lines=None, data=None):
        self.meta, self.source, self.lines, self.data = meta, source, lines, data
        self.bench = meta.get("bench", "")

    def get(self, key):
        return self.meta.get(key) or "not recorded"

    def when(self):
        """Sort key: the first date and time in `date`."""
        m = re.search(r"(\d{4}-\d\d-\d\d)(?:[ T](\d\d:\d\d))?", self.meta.get("date", ""))
        return (m.group(1), m.group(2) or "") if m else ("", "")

    def same_run_as(self, other):
        return all(self.meta.get(k) == other.meta.get(k) for k in ("date", "command", "commit"))


def read_text(path):
    """The records of a text result file: each starts at a `# bench:` line."""
    records, meta, lines = [], None, []
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            m = re.match(r"#\s*(\w+):\s*(.*)$", line)
            if m and m.group(1) == "bench":
                if meta:
                    records.append(Record(meta, path, lines=lines))
                meta, lines = {"bench": m.group(2).strip()}, []
            elif meta is not None and m and not lines:
                meta[m.group(1)] = m.group(2).strip()
            elif meta is not None:
                lines.append(line)
    if meta:
        records.append(Record(meta, path, lines=lines))
    return records


def json_bench(data):
    """Which script wrote this --json file, from its shape."""
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return "accuracy" if "setting" in data[0] else (
            "traffic" if "ring_model_per_step" in data[0] else "")
    if not isinstance(data, dict):
        return ""
    if data.get("bench") == "real_networks":
        return "real_networks"
    if "python_parameters" in data:
        return "own_model_speed"
    if "runs" in data:
        if isinstance(data["runs"], dict) and "fashion-mnist" in data["runs"]:
            return "images"
        return "slow_network" if "link_checks" in data else "throughput"
    if "slow_delay_ms" in data:
        return "stragglers"
    if any(k.startswith("part") for k in data):
        return "federated"
    if "sync" in data and "bytes_sent_steps" in data["sync"]:
        return "compression"
    return ""


def read_json(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    meta = {}
    side = os.path.splitext(path)[0] + ".meta"
    if os.path.exists(side):
        meta = dict(next(iter(read_text(side)), Record({}, side)).meta)
    if "date" not in meta:
        t = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
        meta["date"] = t.strftime("%Y-%m-%d %H:%M UTC") + " (file time)"
    meta["bench"] = meta.get("bench") or json_bench(data)
    meta.setdefault("command", f"(--json {os.path.relpath(path, REPO)})")
    return [Record(meta, path, data=data)]


def read_paths(paths):
    records = []
    for p in paths:
        if not os.path.exists(p):
            sys.exit(f"summary: {p}: no such file or directory")
        files = (sorted(glob.glob(os.path.join(p, "*.txt")) + glob.glob(os.path.join(p, "*.json")))
                 if os.path.isdir(p) else [p])
        for f in files:
            records += read_json(f) if f.endswith(".json") else read_text(f)
    unknown = [r.source for r in records if r.bench not in BENCHES]
    if unknown:
        sys.exit(f"summary: not a result of a known benchmark: {', '.join(sorted(set(unknown)))}")
    return records


# --- printed tables -------------------------------------------------------------------------------

def tables(lines):
    """The markdown tables in `lines`: (caption = the non-empty line before it, rows as dicts
    from normalised header to cell)."""
    out, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        cells = [[c.strip() for c in l.strip().strip("|").split("|")] for l in lines[i:j]]
        head = [norm(h) for h in cells[0]]
        caption = next((l for l in reversed(lines[:i]) if l.strip()), "")
        out.append((caption, head, [dict(zip(head, r)) for r in cells[2:]]))
        i = j
    return out


def norm(header):
    return re.sub(r"[\s,*]", "", header).lower()


def col(row, *prefixes):
    """The cell whose header starts with one of `prefixes` (normalised), or None."""
    for p in prefixes:
        for h, v in row.items():
            if h.startswith(norm(p)) and v not in ("", "—", "-"):
                return v
    return None


def num(cell):
    if cell is None:
        return None
    m = re.search(r"[-−]?[\d,]*\.?\d+", cell.replace("*", ""))
    return float(m.group(0).replace(",", "").replace("−", "-")) if m else None


# --- what each benchmark measured, from its printed tables or its JSON ----------------------------

def throughput(rec):
    """[(workers, krab median, DDP median, printed ratio or None)]."""
    if rec.data is not None:
        runs = rec.data["runs"]
        out = []
        for w in sorted({r["workers"] for r in runs}):
            med = {p: statistics.median(r["samples_per_sec"] for r in runs
                                        if r["peer"] == p and r["workers"] == w)
                   for p in ("krab", "ddp")}
            out.append((w, med["krab"], med["ddp"], None))
        return out
    return [(int(num(r["workers"])), num(col(r, "krab samples")), num(col(r, "DDP samples")),
             num(col(r, "krab / DDP")))
            for _, head, rows in tables(rec.lines) if head[0] == "workers" for r in rows]


OWN_MODEL_RUNS = {"krab, built-in cnn": "builtin", "krab, TorchScript cnn.pt": "scripted",
                  "PyTorch DDP, nn.Module": "ddp"}


def own_model_speed(rec):
    """(workers, {"builtin" | "scripted" | "ddp": median samples/s})."""
    if rec.data is not None:
        runs = rec.data["runs"]
        return rec.data["workers"], {p: statistics.median(r["samples_per_sec"] for r in runs
                                                          if r["peer"] == p)
                                     for p in set(OWN_MODEL_RUNS.values())}
    m = next((re.search(r"(\d+) workers", l) for l in rec.lines if "workers" in l), None)
    medians = {OWN_MODEL_RUNS[r["run"]]: num(col(r, "samples/s"))
               for _, head, rows in tables(rec.lines) if head[0] == "run" for r in rows
               if r["run"] in OWN_MODEL_RUNS}
    return (int(m.group(1)) if m else None), medians


REAL_RUNS = {"krab, TorchScript": "krab", "DDP, out of the box": "ddp",
             "DDP, krab's heap settings": "ddp-heap", "krab, glibc's default heap": "krab-glibc"}


def real_networks(rec):
    """(workers, batch per worker, {network: {run: (median samples/s, median CPU s per
    step)}}), runs as in REAL_RUNS' values."""
    if rec.data is not None:
        d, out = rec.data, {}
        for r in (r for r in d["runs"] if r["repeat"] != "short"):
            out.setdefault(r["net"], {}).setdefault(r["peer"], []).append(r)
        return d["workers"], d["batch_size"], {
            net: {p: (statistics.median(r["samples_per_sec"] for r in rs),
                      statistics.median(r["cpu_per_step"] for r in rs)) for p, rs in by.items()}
            for net, by in out.items()}
    m = next((re.search(r"(\d+) workers x (\d+)", l) for l in rec.lines if "workers x" in l), None)
    out = {}
    for _, head, rows in tables(rec.lines):
        if head[:2] == ["network", "run"]:
            for r in rows:
                if r["run"] in REAL_RUNS:
                    out.setdefault(r["network"], {})[REAL_RUNS[r["run"]]] = (
                        num(col(r, "samples/s")), num(col(r, "CPU s per step")))
    return (int(m.group(1)) if m else None), (int(m.group(2)) if m else None), out


def accuracy(rec):
    """[(setting, krab test accuracy, DDP test accuracy)]."""
    if rec.data is not None:
        acc = {(r["setting"], r["peer"]): r["test_accuracy"] for r in rec.data}
        return [(s, acc[(s, "krab")], acc[(s, "ddp")])
                for s in dict.fromkeys(r["setting"] for r in rec.data)]
    return [(r["setting"], num(col(r, "krab test")), num(col(r, "DDP test")))
            for _, head, rows in tables(rec.lines) if head[0] == "setting" for r in rows]


def traffic(rec):
    """[(W, all-reduce bytes per step, ring model, ratio, loopback/model krab, ... DDP)]."""
    if rec.data is not None:
        return [(r["workers"], r["allreduce_bytes_per_step"], r["ring_model_per_step"],
                 r["ratio"], r["krab_loopback_ratio"], r.get("ddp_loopback_ratio"))
                for r in rec.data]
    return [(int(num(r["w"])), num(col(r, "allreduce bytes")), num(col(r, "ring model")),
             num(col(r, "ratio")), num(col(r, "loopback/model krab", "loopback / model, krab")),
             num(col(r, "loopback/model DDP", "loopback / model, DDP")))
            for _, head, rows in tables(rec.lines) if head[0] == "w" for r in rows]


def compression(rec):
    """{mode: (test accuracy, traffic / sync in %, bound in % or None)}."""
    if rec.data is not None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from compression import MODES  # the bounds, as the script checks them
        base = rec.data["sync"]["bytes_sent_steps"]
        return {m: (r["test_accuracy"], 100 * r["bytes_sent_steps"] / base,
                    None if MODES.get(m, (0, None))[1] is None else 100 * MODES[m][1])
                for m, r in rec.data.items()}
    return {r["mode"]: (num(col(r, "test accuracy")), num(col(r, "traffic / sync")),
                        num(col(r, "bound")))
            for _, head, rows in tables(rec.lines) if head[0] == "mode" for r in rows}


def images(rec):
    """{run: (samples/s, data wait in % or None)}, the built-in source's run included."""
    if rec.data is not None:
        return {k: (r["samples_per_sec"], None if r.get("data_wait_fraction") is None
                    else 100 * r["data_wait_fraction"]) for k, r in rec.data["runs"].items()}
    return {r["data"]: (num(col(r, "samples/s")), num(col(r, "data wait")))
            for _, head, rows in tables(rec.lines) if head[0] == "data" for r in rows}


def rate_label(rate):
    return "unshaped" if rate is None else f"{rate:g} Mbit/s"


def slow_network(rec):
    """(job, target, [(link, system, time to target or None, final accuracy, the printed
    speed-up over DDP or None)])."""
    if rec.data is not None:
        d = rec.data
        runs = [(rate_label(r["rate_mbit"]), r["system"], r.get("time_to_target"),
                 r.get("final_accuracy"), None) for r in d["runs"] if r.get("status") == "ok"]
        return d.get("job", "cnn"), d["args"]["target"], runs
    speedup = {m.group(1, 2): float(m.group(3)) for m in (
        re.match(r"\s*(unshaped|[\d.]+ Mbit/s) (\S+): time to target ([\d.]+)x", l)
        for l in rec.lines) if m}
    job = "gpt" if re.search(r"--job[ =]gpt", rec.get("command")) else "cnn"
    target, runs = None, []
    for _, head, rows in tables(rec.lines):
        ttt = next((h for h in head if h.startswith("timeto")), None)
        if head[:2] != ["link", "system"] or not ttt:
            continue
        target = num(ttt)
        for r in rows:
            t = None if "not reached" in r[ttt] or "capped" in r[ttt] else num(r[ttt])
            runs.append((r["link"], r["system"], t, num(col(r, "final acc")),
                         speedup.get((r["link"], r["system"]))))
    return job, target, runs


def stragglers(rec):
    """(early clock, late clock, {mode: (samples/s slowed, slowed / unslowed, accuracy at the
    early clock, accuracy at the late one)})."""
    if rec.data is not None:
        res = rec.data["results"]
        early = min(r["train_seconds"] for n, r in res.items() if n.endswith("slowed"))
        late = res["sync slowed"]["train_seconds"]

        def at(evals, s):
            return max([e for e in evals if e["seconds"] <= s], default={"test_accuracy": 0.0},
                       key=lambda e: e["seconds"])["test_accuracy"]
        return early, late, {
            m: (res[m + " slowed"]["samples_per_sec"],
                res[m + " slowed"]["samples_per_sec"] / res[m]["samples_per_sec"],
                at(res[m + " slowed"]["evals"], early), at(res[m + " slowed"]["evals"], late),
                None)
            for m in res if not m.endswith("slowed")}
    for _, head, rows in tables(rec.lines):
        clocks = [h for h in head if h.startswith("accuracyat")]
        if head[0] == "mode" and len(clocks) == 2:
            return num(clocks[0]), num(clocks[1]), {
                r["mode"]: (num(col(r, "samples/s slowed")), num(col(r, "slowed / unslowed")),
                            num(r[clocks[0]]), num(r[clocks[1]]),
                            num(col(r, "slowed / sync slowed"))) for r in rows}
    return None


def federated(rec):
    """{"rounds": {partition: (rounds to target or None, wall seconds)}, "target": t,
    "time": {local steps: {clients: (plain s, secure s)}}, "bytes": {clients: (plain MB down,
    secure MB down, plain MB up, secure MB up)}, "byz": {aggregator: final accuracy},
    "failed": {aggregator: failed rounds}}; parts the record does not have are left out."""
    out = {"rounds": {}, "time": {}, "bytes": {}, "byz": {}, "failed": {}, "target": 0.80}
    if rec.data is not None:
        federated_json(rec.data, out)
        return out
    for caption, head, rows in tables(rec.lines):
        if head[0] == "partition":
            t = next(h for h in head if h.startswith("roundsto"))
            out["target"] = num(t)
            for r in rows:
                n = None if "not" in r[t] else int(num(r[t]))
                out["rounds"][r["partition"]] = (n, num(col(r, "wall time")))
        elif head[0] == "clients/round":
            steps = int(num(caption))
            for r in rows:
                n = int(num(r["clients/round"]))
                out["time"].setdefault(steps, {})[n] = (
                    num(col(r, "plain s")), num(col(r, "secure s")), num(col(r, "time secure")))
                down, up = col(r, "MB down"), col(r, "MB up")
                if down and up and n not in out["bytes"]:
                    (pd, sd), (pu, su) = [[num(x) for x in c.split("→")] for c in (down, up)]
                    out["bytes"][n] = (pd, sd, pu, su, num(col(r, "down ratio")),
                                       num(col(r, "up ratio")))
        elif head[0] == "aggregator":
            last = [h for h in head if h.startswith("acc.round")][-1]
            for r in rows:
                out["byz"][r["aggregator"]] = num(r[last])
                out["failed"][r["aggregator"]] = int(num(col(r, "failed rounds")) or 0)
    return out


def federated_json(d, out):
    out["target"] = d.get("args", {}).get("target", 0.80)
    for res in d.get("part1", {}).values():
        out["rounds"][res["label"]] = (res["rounds_to_target"], res["wall_seconds_to_target"])
    for key, by_n in d.get("part2", {}).items():
        for n, res in by_n.items():
            out["time"].setdefault(int(key.rsplit("_", 1)[1]), {})[int(n)] = (
                res["t_plain"], res["t_secure"], None)
            p, s = res["plain"][0], res["secure"][0]
            out["bytes"].setdefault(int(n), (p["bytes_down"] / 1e6, s["bytes_down"] / 1e6,
                                             p["bytes_up"] / 1e6, s["bytes_up"] / 1e6,
                                             None, None))
    for label, res in d.get("part3", {}).items():
        out["byz"][label] = res["final_accuracy"]
        out["failed"][label] = len(res["failed_rounds"])


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
        return krab, f"DDP {v['ddp']:,.1f} s", ratio
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
    if kind == "images":
        return (f"{v['krab']:,.0f} samples/s, data wait {v['wait']:.2f}%",
                f"fashion-mnist {v['peer']:,.0f}; wait goal < 5%", f"{v['krab'] / v['peer']:.2f}×")
    if kind == "fl-byz":
        failed = f" ({v['failed']:.0f} failed rounds)" if v["failed"] else ""
        return f"{v['krab']:.4f}{failed}", f"no attack {v['clean']:.4f}", pt(v["krab"] - v["clean"])
    raise ValueError(kind)


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


def row(measures):
    it = measures[0][0]
    shown = [cells(runs[0]["kind"], [r["values"] for r in runs]) for runs in measures]
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


def table(records):
    slow = [r for r in records if r.bench == "slow_network"]
    items = [it for r in records if r.bench != "slow_network" for it in items_of(r)]
    items += items_slow(slow)
    order = {b: i for i, b in enumerate(BENCHES)}
    items.sort(key=lambda it: order[it["rec"].bench])  # stable: records keep their order
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 3 + "---:|" + "---|" * 4]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows(items)]
    return "\n".join(lines)


# --- record, write, main --------------------------------------------------------------------------

def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                         "unknown CPU")
    except OSError:
        model = "unknown CPU"
    return f"{os.cpu_count()} × {model}"


def header(bench, command):
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"# bench: {bench}\n# date: {now}\n# commit: {commit or 'not recorded'}\n"
            f"# cpu: {cpu_name()}\n# command: {shlex.join(command)}\n")


def record(out, command):
    """Runs `command`, echoing its output, and writes header + output to `out`; the exit
    status is the command's, and nothing is written if it failed."""
    bench = next((b for b in BENCHES for c in command if os.path.basename(c) == b + ".py"), "")
    if not bench:
        sys.exit(f"summary: record: no bench/<name>.py of {', '.join(BENCHES)} in the command")
    head = header(bench, command)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    if proc.wait() != 0:
        sys.exit(f"summary: record: the command failed (exit status {proc.returncode}); "
                 f"{out} not written")
    with open(out, "w", encoding="utf-8") as f:
        f.write(head + "".join(lines))
    if "--json" in command[:-1]:
        meta = os.path.splitext(command[command.index("--json") + 1])[0] + ".meta"
        with open(meta, "w", encoding="utf-8") as f:
            f.write(head)
    print(f"summary: wrote {out}")
    return 0


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
        p.add_argument("file")
        p.add_argument("command", nargs=argparse.REMAINDER,
                       help="-- then the benchmark's command line")
        a = p.parse_args(argv[1:])
        command = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not command:
            p.error("no command after the file")
        return record(a.file, command)
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
    if a.write_doc:
        write_doc(a.write_doc, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
