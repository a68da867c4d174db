"""Models the ``ddp`` tests need beyond tests/toy_models.py."""

from __future__ import annotations

import torch
from torch import nn


class Branchy(nn.Module):
    """A branch ``b`` used only when the caller says so, and a head ``never`` that no forward uses."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)
        self.never = nn.Linear(8, 3)

    def forward(self, x, use_b: bool = True):
        h = torch.tanh(self.trunk(x))
        out = self.a(h)
        return out + self.b(h) if use_b else out


class Reordered(nn.Module):
    """Registers ``last`` before ``first`` but uses ``first`` first: the static plan's order is wrong."""

    def __init__(self):
        super().__init__()
        self.last = nn.Linear(16, 3)
        self.mid = nn.Linear(16, 16)
        self.first = nn.Linear(6, 16)

    def forward(self, x):
        return self.last(torch.tanh(self.mid(torch.tanh(self.first(x)))))


def build(cls, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return cls()
