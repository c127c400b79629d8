#!/usr/bin/env python3
"""Bring your own model: a ResNet-style CNN written in PyTorch, trained by krab, back in Python.

1. defines a small residual network with BatchNorm and saves it with torch.jit.script;
2. saves Fashion-MNIST as tensor files, normalised here: the training split as a directory of
   shards and the test split as one file, each torch.save({"x": X, "y": Y}, FILE);
3. runs `krab train` on 4 workers (model: {name: torchscript, path: ...},
   data: {name: tensors, path: SHARDS, test_path: FILE});
4. loads krab's model.pt into the Python module with load_state_dict(strict=True) and
   evaluates it on the test file it wrote;
5. checks that this accuracy equals the test_accuracy of krab's report (within 0.1 point), and
   that model.ts (the trained TorchScript module krab writes) gives the same predictions.

Run from the repository root after building:
    /usr/bin/python3 examples/own_model/train_own_model.py            # 300 steps
    /usr/bin/python3 examples/own_model/train_own_model.py --steps 40 # the test's short run
Exit status 0 when everything matches, 1 otherwise.
"""
import argparse
import gzip
import json
import pathlib
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")
TRAIN_SHARDS = 4  # 15,000 examples each


class Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a shortcut (a projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(Block(16, 16, 1))
        self.layer2 = nn.Sequential(Block(16, 32, 2))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    # Optional: krab calls these when they exist (see docs/models.md), e.g.
    #   @torch.jit.export
    #   def training_loss(self, x, y): return F.cross_entropy(self.forward(x), y)
    #   @torch.jit.export
    #   def predict(self, x): return self.forward(x)


def read_idx(path: pathlib.Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist(split: str, mean=None, std=None):
    """x as [N, 1, 28, 28] float32 standardised by (mean, std), the training split's own when
    not given; y as int64 class indices. Returns x, y, mean, std."""
    images = read_idx(FASHION_MNIST / f"{split}-images-idx3-ubyte.gz")
    labels = read_idx(FASHION_MNIST / f"{split}-labels-idx1-ubyte.gz")
    x = torch.from_numpy(images.copy()).float().div(255.0).unsqueeze(1)
    if mean is None:
        mean, std = x.mean().item(), x.std().item()
    return (x - mean) / std, torch.from_numpy(labels.astype(np.int64)), mean, std


def save_tensor_files(work: pathlib.Path):
    """Writes work/train/shard-K.pt (the training split in TRAIN_SHARDS files) and work/test.pt,
    as krab's data.name: tensors reads them. Returns the test split."""
    x, y, mean, std = fashion_mnist("train")
    shards = work / "train"
    shards.mkdir(exist_ok=True)
    for old in shards.glob("*.pt"):
        old.unlink()
    for k, (xs, ys) in enumerate(zip(x.chunk(TRAIN_SHARDS), y.chunk(TRAIN_SHARDS))):
        # clone(): a chunk is a view, and torch.save would write the whole storage behind it.
        torch.save({"x": xs.clone(), "y": ys.clone()}, shards / f"shard-{k}.pt")
    x_test, y_test, _, _ = fashion_mnist("t10k", mean, std)
    torch.save({"x": x_test, "y": y_test}, work / "test.pt")
    return x_test, y_test


def accuracy(forward, x, y) -> float:
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (forward(x[i:i + 1000]).argmax(-1) == y[i:i + 1000]).sum().item()
    return correct / len(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--krab", default="build/bin/krab", help="the krab binary")
    ap.add_argument("--workdir", default="runs/own_model", help="where files and runs go")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    work = pathlib.Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = SmallResNet()
    torch.jit.script(model).save(str(work / "net.ts"))
    x, y = save_tensor_files(work)

    job = work / "job.yaml"
    quoted = lambda p: json.dumps(str(p))  # a YAML string, whatever the path holds
    job.write_text(f"""name: own_model
model: {{name: torchscript, path: {quoted(work / 'net.ts')}}}
data: {{name: tensors, path: {quoted(work / 'train')}, test_path: {quoted(work / 'test.pt')},
       batch_size: 32}}
train: {{steps: {args.steps}, optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}}}
parallel: {{workers: {args.workers}}}
checkpoint: {{dir: {quoted(work / 'runs' / '{name}')}}}
""")
    report_path = work / "report.json"
    subprocess.run([args.krab, "train", str(job), "--report", str(report_path)], check=True)
    report = json.loads(report_path.read_text())
    run_dir = pathlib.Path(report["checkpoint"]).parent

    # model.pt: name -> tensor, the module's own names, BatchNorm statistics included.
    model.load_state_dict(torch.load(run_dir / "model.pt"), strict=True)
    model.eval()
    ours = accuracy(model, x, y)
    theirs = report["test_accuracy"]
    print(f"krab's report: test accuracy {100 * theirs:.2f}%")
    print(f"Python, model.pt loaded into SmallResNet: test accuracy {100 * ours:.2f}%")

    # model.ts: the trained TorchScript module itself.
    scripted = torch.jit.load(str(run_dir / "model.ts"))
    same = accuracy(scripted, x, y)
    print(f"Python, torch.jit.load(model.ts): test accuracy {100 * same:.2f}%")

    ok = abs(ours - theirs) <= 0.001 and abs(same - ours) <= 0.001
    print("match" if ok else "MISMATCH: more than 0.1 point apart")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
