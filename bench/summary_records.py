"""Reading result files, for summary.py: the records (a text file's `# key: value` headers and
output, or a benchmark's --json file), the markdown tables a benchmark printed, and what each
benchmark measured, from those tables or its JSON.

Each benchmark has one reader, named after it (throughput, accuracy, slow_network, ...), that
takes a Record and returns plain values (tuples, dicts of numbers); which of them make the
table, and how they are shown, is summary.py's business. A reader accepts tables with fewer
columns than the current script prints (an older script's, or one copied from the page):
columns are found by their header, and a missing one reads as None. Nothing here prints; a
path that does not exist, or a record of no known benchmark, ends the program with a message.
"""
import datetime
import glob
import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHES = ("throughput", "own_model_speed", "real_networks", "accuracy", "traffic", "compression",
           "slow_network", "stragglers", "federated", "images", "zero_memory", "zero_speed",
           "zero_largest", "elastic_kill", "elastic_balance", "elastic_autoscale")


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
    if data.get("bench") in ("real_networks", "zero_largest", "elastic_kill"):
        return data["bench"]
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


def zero_memory(rec):
    """[(width, stage, model-state GiB per rank, predicted GiB, peak RSS GiB per rank)]."""
    return [(int(num(r["width"])), int(num(r["stage"])), num(col(r, "model state")),
             num(col(r, "predicted")), num(col(r, "peak rss")))
            for _, head, rows in tables(rec.lines) if head[0] == "width" for r in rows]


def zero_largest(rec):
    """(cap in GiB or None, [(run, parameters in millions of the largest GPT that trained or
    None, layers x width or what happened instead: "not built", "error", ...)]."""
    if rec.data is not None:
        d = rec.data
        return d["cap_bytes"] / 1024.0 ** 3, [
            (r["label"], r["best"]["parameters"] / 1e6 if r["best"] else None,
             f"{r['best']['layers']} x {r['best']['width']}" if r["best"]
             else (r["status"] or "none of the ladder")) for r in d["rows"]]
    m = next((re.match(r"cap ([\d.]+) GiB", l) for l in rec.lines if l.startswith("cap ")), None)
    return (float(m.group(1)) if m else None), [
        (r["run"], num(col(r, "parameters")), col(r, "largest that trains"))
        for _, head, rows in tables(rec.lines) if head[0] == "run" for r in rows]


def zero_speed(rec):
    """{(model, workers): {stage: (samples/s, bytes per step)}}."""
    out = {}
    for _, head, rows in tables(rec.lines):
        if head[:2] != ["model", "workers"]:
            continue
        for r in rows:
            out.setdefault((r["model"], int(num(r["workers"]))), {})[int(num(r["stage"]))] = (
                num(col(r, "samples/s")), num(col(r, "bytes/step")))
    return out


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


# --- the elastic benchmarks -----------------------------------------------------------------------

def opt(command, name, default):
    """The integer value of `--name N` in a recorded command line, or `default`."""
    m = re.search(rf"--{name}[ =](\d+)", command or "")
    return int(m.group(1)) if m else default


def elastic_kill(rec):
    """{"workers", "epochs", "steps", "zero_stage", "trials", "krab": (median s from the kill to past the
    kill step, steps lost in all, mean test accuracy %, uninterrupted %), "peer": torchrun's
    (median s, steps recomputed in all, mean %, uninterrupted %) or None, "ratio": the printed
    torchrun / krab or None}."""
    cmd = rec.meta.get("command", "")
    out = {"workers": opt(cmd, "workers", 4), "zero_stage": opt(cmd, "zero-stage", 0),
           "epochs": opt(cmd, "epochs", 2), "steps": None, "trials": None, "krab": None, "peer": None, "ratio": None}
    if rec.data is not None:
        d = rec.data
        out["steps"] = d.get("steps")
        for side, lost in (("krab", "lost_steps"), ("torchrun", "recomputed_steps")):
            got = d.get(side) or {}
            trials, base = got.get("trials") or [], got.get("uninterrupted") or {}
            if not trials:
                continue
            past = [t["past_seconds"] for t in trials if t.get("past_seconds") is not None]
            accs = [100 * t["test_accuracy"] for t in trials if t.get("test_accuracy") is not None]
            out["trials"] = len(trials)
            out["krab" if side == "krab" else "peer"] = (
                statistics.median(past) if past else None, sum(t.get(lost) or 0 for t in trials),
                statistics.mean(accs) if accs else None,
                None if base.get("test_accuracy") is None else 100 * base["test_accuracy"])
        return out
    text = "\n".join(rec.lines)
    m = re.search(r"elastic_kill: .*?(\d+) workers.*?(\d+) epoch\(s\) = (\d+) steps", text)
    if m:
        out["workers"], out["epochs"], out["steps"] = map(int, m.groups())
    m = re.search(r"zero_stage (\d+)", text)
    out["zero_stage"] = int(m.group(1)) if m else out["zero_stage"]
    for side, name in (("krab", "krab"), ("peer", "torchrun")):
        m = re.search(rf"^{name}, (\d+) kills.*?past the kill step median ([\d.]+) s.*?"
                      r"(?:lost steps|steps recomputed) (\d+) in all\n\s*test accuracy ([\d.]+) "
                      r"%.*?uninterrupted ([\d.]+) %", text, re.M)
        if m:
            out["trials"] = int(m.group(1))
            out[side] = (float(m.group(2)), int(m.group(3)), float(m.group(4)),
                         float(m.group(5)))
    m = re.search(r"torchrun's time lost / krab's \(medians\): ([\d.]+)x", text)
    out["ratio"] = float(m.group(1)) if m else None
    return out


def elastic_balance(rec):
    """(workers, [(straggler, equal slices samples/s, balanced samples/s, printed balanced /
    equal, best possible, last split)])."""
    m = next((re.search(r"(\d+) workers", l) for l in rec.lines
              if l.startswith("elastic_balance:")), None)
    return (int(m.group(1)) if m else None), [
        (r["straggler"], num(col(r, "equal slices")), num(col(r, "balanced (")),
         num(col(r, "balanced /")), num(col(r, "best possible")), col(r, "last split"))
        for _, head, rows in tables(rec.lines) if head[0] == "straggler" for r in rows]


def elastic_autoscale(rec):
    """{"max": max workers or None, "runs": {provider: (settled at, settled?, samples/s over
    the run, wall s)}, "fixed": {workers: samples/s of the fixed-size run}}."""
    out = {"max": None, "runs": {}, "fixed": {}}
    for line in rec.lines:
        m = re.match(r"(\w+): settled at (\d+) worker\(s\) \(settled: (\w+)\), (\d+) "
                     r"samples/s over the run, (\d+) s wall", line)
        if m:
            out["runs"][m.group(1)] = (int(m.group(2)), m.group(3) == "True",
                                       float(m.group(4)), float(m.group(5)))
        m = re.search(r"max (\d+)", line) if line.startswith("elastic_autoscale:") else None
        if m:
            out["max"] = int(m.group(1))
    for _, head, rows in tables(rec.lines):
        if head[0] == "workers":
            for r in rows:
                sps = num(col(r, "fixed size"))
                if sps is not None:
                    out["fixed"][int(num(r["workers"]))] = sps
    return out
