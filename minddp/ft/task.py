"""What the fault-tolerant rung trains: a task gives the model, its optimizer, the global batch of any step.

The rung asks for the global batch of a step by number (a retried step, or a
healed rank, must see the same examples) and splits it by the world size of
the moment (:meth:`ToyTask.shard`). :class:`ToyTask` is the small regression
the tests, the benchmark and the notebook use; :mod:`minddp.train.ft` wraps
the train command's model and data in the same four methods.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class ToyTask:
    """A two-layer MLP fitting a fixed random linear map; ``global_batch`` examples per step, AdamW."""

    def __init__(
        self,
        dim: int = 8,
        hidden: int = 16,
        global_batch: int = 12,
        seed: int = 0,
        lr: float = 0.01,
        compute_s: float = 0.0,
    ):
        self.dim, self.hidden, self.batch, self.seed, self.lr = dim, hidden, global_batch, seed, lr
        self.compute_s = compute_s  # a pause per step standing in for a real model's compute (no CPU used)

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return nn.Sequential(nn.Linear(self.dim, self.hidden), nn.Tanh(), nn.Linear(self.hidden, 1))

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.lr)

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same ``(x, y)`` for ``step`` in every process, every attempt."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        x = torch.randn(self.batch, self.dim, generator=g)
        w = torch.Generator().manual_seed(self.seed)
        target = torch.randn(self.dim, 1, generator=w)
        return x, x @ target + 0.1 * torch.randn(self.batch, 1, generator=g)

    def shard(self, batch, rank: int, world: int):
        """Rows ``[rank*B // w, (rank+1)*B // w)``: the whole global batch, split among the members of now."""
        x, y = batch
        lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
        return x[lo:hi], y[lo:hi], len(x)

    def loss(self, model: nn.Module, shard, world: int) -> torch.Tensor:
        """The shard's squared error, weighted so that the mean over ``world`` shards is the global mean."""
        x, y, total = shard
        if self.compute_s:
            time.sleep(self.compute_s)
        return ((model(x) - y) ** 2).sum() * (world / total)
