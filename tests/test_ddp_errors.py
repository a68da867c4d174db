"""The ``ddp`` stage's errors: clear, on time, on every rank that must stop, never a hang.

All cases run in one launch; each case catches its own error inside the
ranks (the cases are built so that every rank issues the same collectives,
so a caught error leaves the process group usable for the next case).
"""

from __future__ import annotations

import time

import ddp_models
import torch
import torch.distributed as dist
from torch import nn

import minddp.debug
from minddp import DistributedDataParallel, launch


def caught(fn) -> str:
    try:
        fn()
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


class Twins(nn.Module):
    """Two layers of identical shapes: swapping their buckets keeps every all_reduce the same size."""

    def __init__(self):
        super().__init__()
        self.one = nn.Linear(8, 8)
        self.two = nn.Linear(8, 8)

    def forward(self, x):
        return self.two(torch.tanh(self.one(x)))


def errors_on_rank() -> dict:
    rank = dist.get_rank()
    out = {}
    # Construction: a different model on rank 1.
    out["mismatch"] = caught(lambda: DistributedDataParallel(nn.Linear(6, 4 + rank)))
    out["device_ids_on_cpu"] = caught(lambda: DistributedDataParallel(nn.Linear(6, 4), device_ids=[0]))

    # A parameter that never gets a gradient, without find_unused_parameters.
    net = DistributedDataParallel(ddp_models.build(ddp_models.Branchy, seed=0), bucket_cap_mb=0.0002)
    x = torch.randn(4, 6)
    steps_done = []

    def two_steps():
        for step in range(2):
            net(x, use_b=False).sum().backward()  # step 0's backward must return, not hang
            steps_done.append(step)

    start = time.monotonic()
    out["unused"] = caught(two_steps)
    out["unused_seconds"] = time.monotonic() - start
    out["unused_steps_done"] = steps_done

    # The consistency guard: rank 1's plan has the twin weights' buckets swapped (same sizes, wrong sums).
    minddp.debug.enable()
    for desync in (False, True):
        torch.manual_seed(0)
        guarded = DistributedDataParallel(Twins(), bucket_cap_mb=1e-6)
        # one parameter per bucket (the first iteration's plan is one bucket, as torch's)
        plan = [[i] for i in reversed(range(len(guarded.bucket_plan[0])))]
        if desync and rank == 1:
            names = [n for n, _ in Twins().named_parameters()]
            a, b = (next(k for k, bk in enumerate(plan) if names[bk[0]] == w) for w in ("one.weight", "two.weight"))
            plan[a], plan[b] = plan[b], plan[a]
        guarded.reducer.set_plan(plan)
        out[f"guard_desync={desync}"] = caught(lambda: guarded(torch.randn(2, 8)).sum().backward())
    minddp.debug.disable()
    return out


def test_errors():
    results = launch(errors_on_rank, world_size=2, backend="gloo", timeout_s=60)
    for rank, r in enumerate(results):
        assert "same model across all ranks" in r["mismatch"] and "'weight'" in r["mismatch"], r["mismatch"]
        assert "rank 1" in r["mismatch"] and "size mismatch" in r["mismatch"]
        assert r["device_ids_on_cpu"].startswith("ValueError") and "device_ids" in r["device_ids_on_cpu"]
        # The bad step completes; the next forward raises, naming the parameters.
        assert r["unused_steps_done"] == [0], r
        assert "Expected to have finished reduction in the prior iteration" in r["unused"], r["unused"]
        assert (
            "b.weight" in r["unused"] and "never.bias" in r["unused"] and "find_unused_parameters=True" in r["unused"]
        )
        assert r["guard_desync=False"] == "no error", r["guard_desync=False"]
        assert "consistency guard" in r["guard_desync=True"] and "bucket" in r["guard_desync=True"], r
