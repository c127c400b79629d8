"""Checks that two model.pt files (name -> tensor, as krab writes them) hold the same
parameters up to a relative tolerance: max |a - b| / max |b| over each tensor.

    compare_models.py A.pt B.pt [TOLERANCE]      exit 0 when equal, 1 otherwise
"""
import sys

import torch


def main():
    a_path, b_path = sys.argv[1], sys.argv[2]
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    a, b = torch.load(a_path), torch.load(b_path)
    # model.pt also holds buffers; the example writes parameters only (its model has no buffers).
    missing = sorted(set(b) - set(a)) + sorted(set(a) - set(b))
    if missing:
        print(f"{a_path} and {b_path} name different tensors: {missing}")
        return 1
    worst = 0.0
    for name in sorted(a):
        x, y = a[name].double(), b[name].double()
        if x.shape != y.shape:
            print(f"{name}: shape {list(x.shape)} vs {list(y.shape)}")
            return 1
        rel = ((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item()
        worst = max(worst, rel)
    print(f"{a_path} vs {b_path}: {len(a)} tensors, max relative difference {worst:.3g}")
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
