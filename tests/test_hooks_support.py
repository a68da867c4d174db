"""Shared pieces of the comm-hook tests: one small model, per-rank data, training runs.

(No tests here; the ``test_`` prefix only keeps it inside the files the hook
tests own.)

The model has three weight matrices of different shapes (all worth
compressing at ranks 1 and 2) and three bias vectors (never compressed), so
PowerSGD's two paths both run.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp.ladder import build_stage, options_for
from minddp.ladder.loop import train_step

IN, HID1, HID2, OUT = 16, 32, 24, 8
#: Per-rank micro-batch rows.
ROWS = 8


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HID1), nn.Tanh(), nn.Linear(HID1, HID2), nn.Tanh(), nn.Linear(HID2, OUT))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data for ``step``: different on every rank and step, same in every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(ROWS, IN, generator=g)
    # A target with structure (a fixed linear map) so the loss can go down.
    w = torch.Generator().manual_seed(7)
    return x, torch.tanh(x @ torch.randn(IN, OUT, generator=w))


def loss_fn(model: nn.Module, b) -> torch.Tensor:
    x, y = b
    return nn.functional.mse_loss(model(x), y)


def wrap(stage: str, model: nn.Module, state=None, hook=None, bucket_cap_mb=None) -> nn.Module:
    """``torch`` (torch's DDP) or a minddp stage, with ``hook`` registered if given."""
    if stage == "torch":
        ddp = TorchDDP(model, bucket_cap_mb=bucket_cap_mb or 25)
    else:
        ddp = build_stage(stage, model, **options_for(stage, bucket_cap_mb=bucket_cap_mb))
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return ddp


def train(ddp: nn.Module, steps: int, rank: int, first_step: int = 0, optimizer=None, lr: float = 0.05):
    """Train ``steps`` steps; return (losses, optimizer)."""
    optimizer = optimizer or torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    losses = [train_step(ddp, optimizer, [batch(rank, s)], loss_fn) for s in range(first_step, first_step + steps)]
    return losses, optimizer


def params_of(ddp: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in ddp.parameters()])


def fresh(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
