"""Writes a TorchScript module that uses most of torch.nn's layers, as a user's network would.

    python3 write_layer_zoo.py OUT

Convolutions (plain, depthwise, 1x1), BatchNorm, GroupNorm, LayerNorm, the common activations,
a squeeze-and-excitation gate, residual adds, pooling, interpolation, dropout, an LSTM and
multi-head attention over the flattened feature map, and a linear head: images [B, 3, 16, 16]
to 10 classes. The module's code is what torch.jit.script writes for these layers, so an
inspection that refuses none of it does not refuse ordinary networks.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(c, c // 2, 1)
        self.expand = nn.Conv2d(c // 2, c, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        return x * self.gate(self.expand(F.relu(self.reduce(self.pool(x)))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.depthwise = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.Hardswish()
        self.se = SqueezeExcite(c)
        self.project = nn.Conv2d(c, c, 1, bias=False)
        self.norm = nn.GroupNorm(2, c)

    def forward(self, x):
        return x + self.norm(self.project(self.se(self.act(self.bn(self.depthwise(x))))))


class Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU6(inplace=True))
        self.blocks = nn.ModuleList([Block(8), Block(8)])
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(1)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 10)
        self.acts = nn.ModuleList([nn.SiLU(), nn.GELU(), nn.LeakyReLU(0.1), nn.ELU(), nn.Tanh()])

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = F.interpolate(self.avg(self.pool(x)), scale_factor=2.0, mode="nearest")
        seq = torch.flatten(x, 2).transpose(1, 2)
        seq, _ = self.lstm(seq)
        seq, _ = self.attention(seq, seq, seq, need_weights=False)
        for act in self.acts:
            seq = act(seq)
        h = self.drop(self.norm(seq.mean(dim=1)))
        return F.log_softmax(self.head(h), dim=-1).exp().log()


torch.manual_seed(0)
torch.jit.script(Zoo()).save(sys.argv[1])
