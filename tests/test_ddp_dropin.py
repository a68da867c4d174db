"""Drop-in fidelity: user scripts run under torch's DDP and minddp's, compared bit for bit.

Each case is a small 2-rank training script with the DDP class as its only
parameter; the oracle is the same script under
``torch.nn.parallel.DistributedDataParallel``. Compared: every step's
gradients (values, and which are ``None``) and the final parameters, bitwise;
or, where torch refuses, the same refusal. All cases share one launch.
"""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

from minddp import DistributedDataParallel, launch

STEPS = 3


class Heads(nn.Module):
    """A trunk and two heads; the loss may use only one of them (multi-task, auxiliary outputs)."""

    def __init__(self):
        super().__init__()
        self.trunk, self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        return {"a": self.a(h), "b": self.b(h)}


@dataclass
class Out:
    """An output object like Hugging Face's ModelOutput."""

    logits: torch.Tensor
    aux: torch.Tensor | None = None


class NeverUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.never = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


class DataclassOut(NeverUsed):
    """A dataclass output; ``never`` is unused, and the search must look inside the dataclass to see ``used``."""

    def forward(self, x):
        return Out(logits=super().forward(x))


class Checkpointed(nn.Module):
    """Reentrant activation checkpointing around the last layers."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 8)
        self.trunk = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x):
        return checkpoint(self.trunk, torch.tanh(self.first(x)), use_reentrant=True)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(100 * step + rank))


def loss_of(out) -> torch.Tensor:
    if isinstance(out, dict):
        return out["a"].pow(2).sum()  # head "b" is not in the loss
    if isinstance(out, Out):
        return out.logits.pow(2).sum()
    return out.pow(2).sum()


def train(DDP, make, steps=STEPS, options=None, between=None, hook=None):
    """The user script: seeded model (different per rank), DDP, SGD with momentum; grads per step, params."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = make()
    ddp = DDP(model, **(options or {}))
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(steps):
        loss_of(ddp(batch(step, rank))).backward()
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
        if between is not None:
            between(ddp, step)
    return grads, torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def differences(theirs, ours) -> list[str]:
    (g1, p1), (g2, p2) = theirs, ours
    out = [
        f"step {s} {n}: torch {'None' if a[n] is None else 'grad'}, ours {'None' if b[n] is None else 'grad'}"
        for s, (a, b) in enumerate(zip(g1, g2))
        for n in a
        if (a[n] is None) != (b[n] is None)
    ]
    out += [
        f"step {s} {n}: grads differ by {(a[n] - b[n]).abs().max():.3g}"
        for s, (a, b) in enumerate(zip(g1, g2))
        for n in a
        if a[n] is not None and b[n] is not None and not torch.equal(a[n], b[n])
    ]
    if not torch.equal(p1, p2):
        out.append(f"final parameters differ by {(p1 - p2).abs().max():.3g}")
    return out


def compare(**kw) -> list[str]:
    return differences(train(TorchDDP, **kw), train(DistributedDataParallel, **kw))


def saliency_on_rank0(ddp, step):
    """A rank-0-only backward through ``ddp.module`` (e.g. a saliency map for logging)."""
    if dist.get_rank() == 0:
        x = batch(50 + step, 0).requires_grad_()
        ddp.module(x).pow(2).sum().backward()
        ddp.module.zero_grad(set_to_none=True)


def copies(DDP) -> dict:
    """copy.deepcopy and torch.save/torch.load of a wrapper: working wrappers that train like the original."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
    ddp = DDP(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    loss_of(ddp(batch(0, rank))).backward()
    buf = io.BytesIO()
    torch.save(ddp, buf)
    buf.seek(0)
    results = {}
    for label, clone in (("deepcopy", copy.deepcopy(ddp)), ("save-load", torch.load(buf, weights_only=False))):
        opt = torch.optim.SGD(clone.parameters(), lr=0.1)
        for step in range(1, STEPS):
            opt.zero_grad()
            loss_of(clone(batch(step, rank))).backward()
            opt.step()
        results[label] = torch.cat([p.detach().reshape(-1) for p in clone.parameters()])
    return results


def rewrap(DDP) -> torch.Tensor:
    """Train, then wrap the same module again (dropping the old wrapper), and train on."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
    ddp = DDP(nn.Linear(4, 2))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        if step == 1:
            ddp = DDP(ddp.module)
        opt.zero_grad()
        loss_of(ddp(batch(step, rank))).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


def uneven(DDP, divide_by_initial_world_size: bool) -> torch.Tensor:
    """Uneven inputs under join(): rank r has 5 - 2r batches."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    ddp = DDP(model, bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for step in range(5 - 2 * rank):
            opt.zero_grad()
            loss_of(ddp(batch(step, rank))).backward()
            opt.step()
    return torch.cat([t.detach().reshape(-1).float() for t in [*model.parameters(), *model.buffers()]])


def refusal(DDP, make) -> str:
    try:
        DDP(make())
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def cases_on_rank() -> dict:
    out = {
        "1-unused-output": compare(make=Heads, options={"find_unused_parameters": True}),
        "2-dataclass-output": compare(make=DataclassOut, options={"find_unused_parameters": True}),
        "3-torch-fp16-wrapper": compare(
            make=Heads,
            options={"find_unused_parameters": True},
            hook=torch_hooks.fp16_compress_wrapper(torch_hooks.allreduce_hook),
        ),
        "4-reentrant-checkpoint": compare(make=Checkpointed),
        "6-backward-through-module": compare(make=Checkpointed, between=saliency_on_rank0),
        "8-static-graph": compare(make=NeverUsed, options={"static_graph": True}),
        "8-static-graph-bucketed": compare(make=NeverUsed, options={"static_graph": True, "bucket_cap_mb": 1e-6}),
    }
    theirs, ours = copies(TorchDDP), copies(DistributedDataParallel)
    out["5-deepcopy-save"] = [f"{k}: differs" for k in theirs if not torch.equal(theirs[k], ours[k])]
    out["8-rewrap"] = [] if torch.equal(rewrap(TorchDDP), rewrap(DistributedDataParallel)) else ["differs"]
    for divide in (True, False):
        theirs, ours = uneven(TorchDDP, divide), uneven(DistributedDataParallel, divide)
        out[f"8-join-divide={divide}"] = (
            [] if torch.equal(theirs, ours) else [f"differs by {(theirs - ours).abs().max():.3g}"]
        )
    out["refusals"] = {
        "all-frozen": (
            refusal(TorchDDP, lambda: nn.Linear(2, 2).requires_grad_(False)),
            refusal(DistributedDataParallel, lambda: nn.Linear(2, 2).requires_grad_(False)),
        ),
        "sparse": refusal(DistributedDataParallel, lambda: nn.Embedding(10, 3, sparse=True)),
    }
    return out


@pytest.fixture(scope="module")
def results():
    return launch(cases_on_rank, world_size=2, timeout_s=60)


CASES = [
    "1-unused-output",
    "2-dataclass-output",
    "3-torch-fp16-wrapper",
    "4-reentrant-checkpoint",
    "5-deepcopy-save",
    "6-backward-through-module",
    "8-static-graph",
    "8-static-graph-bucketed",
    "8-rewrap",
    "8-join-divide=True",
    "8-join-divide=False",
]


@pytest.mark.parametrize("case", CASES)
def test_script_gives_torchs_results_bit_for_bit(results, case):
    for rank, r in enumerate(results):
        assert r[case] == [], (rank, r[case])


def test_refusals_are_torchs_or_name_the_fix(results):
    for r in results:
        theirs, ours = r["refusals"]["all-frozen"]
        assert theirs.startswith("RuntimeError: DistributedDataParallel is not needed"), theirs
        assert ours.startswith("RuntimeError: DistributedDataParallel is not needed"), ours
        sparse = r["refusals"]["sparse"]
        assert sparse.startswith("ValueError") and "sparse=True" in sparse and "sparse=False" in sparse, sparse
