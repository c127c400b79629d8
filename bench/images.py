#!/usr/bin/python3
"""Image folders: krab's `data.name: images` against the built-in Fashion-MNIST source.

What it does: writes the first N (default 10,000) Fashion-MNIST training images and the first
2,000 test images as 28x28 grey PNG files in the ImageFolder layout (ROOT/class<k>/<n>.png; the
PNGs are written with zlib + struct, no imaging library), then trains krab's `cnn` on 2 workers
for S steps (default 200), batch 64 per worker, four ways, one after another:

  fashion-mnist   the built-in IDX source (the baseline)
  images          the PNG folder: listed and header-checked at load, decoded per batch on
                  data.decode_threads background threads, decoded images kept in the default
                  data.cache_mb (1024 MiB: the whole set fits, so from the second epoch on
                  batches come mostly from the cache)
  images-nocache  the same with data.cache_mb 1 (334 images of 10,000): nearly every example of
                  every batch is decoded from its file, as for a set larger than memory
  images+aug      `images` with data.random_crop 2 and data.random_flip

and prints, for each, samples/s (after warm-up), the report's `data_wait_fraction` (the share
of the training loop's time the training thread spent waiting for its next batch; the images
runs only, the built-in source gathers on the training thread and is not measured; goal < 5%),
the test accuracy and the whole process's seconds (load included). The CPU model and core
count are printed beside the numbers, and the table is markdown, for bench/summary.py.

Run from the repository root:
  /usr/bin/python3 bench/images.py                     # 10,000 images, 200 steps
  /usr/bin/python3 bench/images.py --images 2000 --steps 30   # quick check
Options: --krab build/bin/krab  --threads 2 (data.decode_threads)  --repeats 1 (the four runs in
turn, this many times round; the table shows medians)  --json FILE (raw results)
Exit status 1 if a run fails. Nothing is downloaded.
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import zlib

from common import REPO, machine_load, run_krab

FASHION = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return n, rows, cols, data[16:]
    return n, 0, 0, data[8:]


def png_bytes(pixels, rows, cols):
    """An 8-bit grey PNG: signature, IHDR, one IDAT (each row led by filter byte 0), IEND."""
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + pixels[r * cols:(r + 1) * cols] for r in range(rows))
    ihdr = struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) +
            chunk(b"IEND", b""))


def write_folder(root, prefix, count):
    n, rows, cols, images = read_idx(os.path.join(FASHION, f"{prefix}-images-idx3-ubyte.gz"))
    _, _, _, labels = read_idx(os.path.join(FASHION, f"{prefix}-labels-idx1-ubyte.gz"))
    count = min(count, n)
    size = rows * cols
    for k in range(10):
        os.makedirs(os.path.join(root, f"class{k}"), exist_ok=True)
    for i in range(count):
        path = os.path.join(root, f"class{labels[i]}", f"{i:06d}.png")
        with open(path, "wb") as f:
            f.write(png_bytes(images[i * size:(i + 1) * size], rows, cols))
    return count


JOB = """\
name: images-bench
model: {{name: cnn}}
data: {{batch_size: 64}}
parallel: {{workers: 2}}
train:
  threads_per_worker: 1
  seed: 0
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
checkpoint: {{dir: {ckpt}}}
"""


def cpu_name():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in out.splitlines()
                  if l.startswith("Model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores"


def measure(krab, job, tmp, runs, args):
    """Each configuration in turn, `repeats` times round: {name: medians, and every run}."""
    each = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, sets in runs.items():
            load = machine_load()
            report, seconds = run_krab("images", krab, job, os.path.join(tmp, f"{name}.json"),
                                       sets + [f"train.steps={args.steps}"])
            each[name].append({
                "samples_per_sec": report["samples_per_sec"],
                "data_wait_fraction": report.get("data_wait_fraction"),
                "test_accuracy": report["test_accuracy"], "process_seconds": round(seconds, 2),
                "load_before": load[0], "compilers_running": load[1]})
    out = {}
    for name, rs in each.items():
        med = {k: (None if rs[0][k] is None else statistics.median(r[k] for r in rs))
               for k in ("samples_per_sec", "data_wait_fraction", "test_accuracy",
                         "process_seconds")}
        out[name] = dict(med, each=rs)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--krab", default=os.path.join(REPO, "build", "bin", "krab"))
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="krab-images-bench-")
    try:
        krab = shutil.copy(args.krab, os.path.join(tmp, "krab"))  # a rebuild cannot swap it
        train_root, test_root = os.path.join(tmp, "train"), os.path.join(tmp, "test")
        n = write_folder(train_root, "train", args.images)
        write_folder(test_root, "t10k", 2000)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB.format(ckpt=os.path.join(tmp, "runs")))
        images = ["data.name=images", f"data.path={train_root}", f"data.test_path={test_root}",
                  "data.size=28x28", "data.mean=0.2860", "data.std=0.3530",
                  f"data.decode_threads={args.threads}"]
        runs = {
            "fashion-mnist": ["data.name=fashion-mnist", f"data.path={FASHION}"],
            "images": images,
            "images-nocache": images + ["data.cache_mb=1"],
            "images+aug": images + ["data.random_crop=2", "data.random_flip=true"],
        }
        results = {"cpu": cpu_name(), "images": n, "steps": args.steps, "workers": 2,
                   "repeats": args.repeats, "runs": measure(krab, job, tmp, runs, args)}
        print(f"{n} PNG images, {args.steps} steps on 2 workers, cnn, batch 64 per worker, "
              f"decode_threads {args.threads}, median of {args.repeats} alternating runs; "
              f"{results['cpu']}")
        print("| data | samples/s | data wait | test acc. | process s |")
        print("|---|---:|---:|---:|---:|")
        for name, r in results["runs"].items():
            wait = r["data_wait_fraction"]
            wait_s = "-" if wait is None else f"{100 * wait:.2f}%"
            sps = r["samples_per_sec"] or 0
            print(f"| {name} | {sps:,.0f} | {wait_s} | {r['test_accuracy']:.4f} "
                  f"| {r['process_seconds']:.1f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        print(json.dumps(results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
