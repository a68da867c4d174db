"""Small models the tests train, each exercising one thing DDP must get right.

Every builder takes a seed so tests can build *different* initial weights on
different ranks (to prove the broadcast) and the same weights in the oracle.
Batches are dicts so one ``loss_fn`` serves every model.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


class TiedFrozen(nn.Module):
    """An embedding tied to the output projection (one tensor reached twice) and a frozen layer."""

    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.mix = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight  # tied

    def forward(self, x):
        h = self.embed(x).mean(dim=1)
        return self.out(torch.tanh(self.mix(self.frozen(h))))


class BNNet(nn.Module):
    """BatchNorm: running statistics are buffers that rank 0 must broadcast.

    The layer before BatchNorm has no bias: BatchNorm cancels it, so its
    gradient is pure rounding noise, which Adam would blow up to full-size steps.
    """

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 12, bias=False), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 3))

    def forward(self, x):
        return self.net(x)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForSequenceClassification

    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
        num_labels=3,
        pad_token_id=0,
    )
    return LlamaForSequenceClassification(cfg)


BUILDERS = {"mlp": MLP, "tied": TiedFrozen, "bn": BNNet, "llama": tiny_llama}


def build(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return BUILDERS[name]()


def global_batches(name: str, steps: int, rows: int, seed: int = 1234) -> list[dict]:
    """``steps`` global batches of ``rows`` rows each, deterministic from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        if name in ("tied", "llama"):
            x = torch.randint(1, 11 if name == "tied" else 32, (rows, 5), generator=g)
        else:
            x = torch.randn(rows, 6, generator=g)
        y = torch.randint(0, 11 if name == "tied" else 3, (rows,), generator=g)
        out.append({"x": x, "y": y})
    return out


def loss_fn(model: nn.Module, batch: dict) -> torch.Tensor:
    out = model(batch["x"])
    logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits, batch["y"])


def shard(batch: dict, index: int, parts: int) -> dict:
    """Rows ``index::parts`` of a batch: the per-rank (or per-micro-batch) piece."""
    rows = batch["x"].shape[0] // parts
    return {k: v[index * rows : (index + 1) * rows] for k, v in batch.items()}
