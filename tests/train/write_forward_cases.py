"""Writes the files of the forward dry-run tests (preflight_e2e_test.cpp) into OUT:

    python3 write_forward_cases.py OUT

net.pt      a float32 module, Linear(8, 4) after a flatten, as torch.jit.script writes it
wide.pt     the same with Linear(100, 4): it cannot take examples of 8 features
dropout.pt  Linear(8, 16) -> dropout(0.5) -> Linear(16, 4): its forward draws random numbers
raises.pt   net.pt whose forward raises ValueError for inputs of more than one dimension
train.pt    {x: float32 [64, 8], y: int64 [64] in [0, 4)}
train64.pt  the same inputs as float64
pairs.pt    float32 inputs with two labels per example, y: int64 [64, 2]
"""
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = torch.nn.Linear(features, 4)

    def forward(self, x):
        return self.fc(x.flatten(1))


class Dropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class Raises(Net):
    def forward(self, x):
        if x.dim() > 1:
            raise ValueError("x must be one-dimensional")
        return self.fc(x)


out = sys.argv[1]
torch.manual_seed(0)
torch.jit.script(Net(8)).save(f"{out}/net.pt")
torch.jit.script(Net(100)).save(f"{out}/wide.pt")
torch.jit.script(Dropout()).save(f"{out}/dropout.pt")
torch.jit.script(Raises(8)).save(f"{out}/raises.pt")
x = torch.randn(64, 8)
y = torch.randint(0, 4, (64,))
torch.save({"x": x, "y": y}, f"{out}/train.pt")
torch.save({"x": x.double(), "y": y}, f"{out}/train64.pt")
torch.save({"x": x, "y": torch.randint(0, 4, (64, 2))}, f"{out}/pairs.pt")
