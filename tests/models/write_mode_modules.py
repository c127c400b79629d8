"""Writes the TorchScript modules of the train/eval-flag and non-persistent-buffer tests.

    python3 write_mode_modules.py OUTDIR

Every module takes x [B, 32] (krab's synthetic data) and gives logits [B, 4]. In OUTDIR:

  train_trace.ts    torch.jit.trace of a net with BatchNorm and Dropout in train mode: its code
                    calls batch_norm and dropout with training=True, whatever the mode
  eval_trace.ts     the same net traced after .eval(): training=False, whatever the mode
  stateless_trace.ts  traced in train mode, but every flag it fixes cannot change the result:
                    BatchNorm and InstanceNorm without running statistics, an LSTM without
                    dropout, Dropout(p=0)
  script.ts         torch.jit.script of a net with BatchNorm, InstanceNorm with running
                    statistics, four kinds of dropout, RReLU and a two-layer LSTM with dropout:
                    every flag read from `training`
  nonpersistent.ts  torch.jit.script of a net whose own class registers a persistent buffer
                    (`keep`) and a non-persistent one (`scratch`), beside a BatchNorm
  nonpersistent.keys  the Python module's state_dict() keys, one a line
"""
import os
import sys

import torch
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self, track=True, p=0.5):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, track_running_stats=track)
        self.drop = nn.Dropout(p)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x.view(-1, 2, 4, 4))))
        return self.head(self.drop(x.flatten(1)))


class Stateless(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = ConvNet(track=False, p=0.0)
        self.inorm = nn.InstanceNorm1d(4)
        self.lstm = nn.LSTM(1, 4, batch_first=True)
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        h = self.inorm(self.body(x).unsqueeze(1).expand(-1, 4, -1))
        out, _ = self.lstm(h.flatten(1).unsqueeze(-1))
        return self.head(out[:, -1])


class Scripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = ConvNet()
        self.inorm = nn.InstanceNorm1d(4, track_running_stats=True)
        self.drops = nn.ModuleList([nn.Dropout2d(0.2), nn.AlphaDropout(0.2),
                                    nn.FeatureAlphaDropout(0.2)])
        self.act = nn.RReLU()
        self.lstm = nn.LSTM(1, 4, num_layers=2, dropout=0.2, batch_first=True)
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        h = self.body(x).unsqueeze(1).expand(-1, 4, -1).unsqueeze(-1)
        for d in self.drops:
            h = d(h)
        h = self.act(self.inorm(h.squeeze(-1)))
        out, _ = self.lstm(h.flatten(1).unsqueeze(-1))
        return self.head(out[:, -1])


class WithScratch(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = ConvNet()
        self.register_buffer("keep", torch.zeros(4))
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x):
        return self.body(x) * self.scratch + self.keep


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    save = lambda m, name: m.save(os.path.join(out, name))
    # check_trace=False: a trace in train mode with dropout differs from the module by design.
    save(torch.jit.trace(ConvNet().train(), x, check_trace=False), "train_trace.ts")
    save(torch.jit.trace(ConvNet().eval(), x), "eval_trace.ts")
    save(torch.jit.trace(Stateless().train(), x, check_trace=False), "stateless_trace.ts")
    save(torch.jit.script(Scripted()), "script.ts")
    m = WithScratch()
    save(torch.jit.script(m), "nonpersistent.ts")
    with open(os.path.join(out, "nonpersistent.keys"), "w") as f:
        f.write("".join(k + "\n" for k in m.state_dict()))


if __name__ == "__main__":
    main()
