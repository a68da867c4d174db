"""torch.compile with minddp's wrappers: the same training as eager and as torch's compiled DDP, no graph break of
minddp's making, and buckets sent while backward still computes.

One launch of 2 ranks (gloo) trains a small MLP a few steps in each configuration below and reports what the
tests read; each configuration starts from ``torch._dynamo.reset()``, so no compiled graph (and no count of
Dynamo's) carries over from one to the next: every instance of a class shares Dynamo's cache.

* **values**: the parameters after the steps, compared bit for bit. The backend is ``aot_eager``: it runs the
  same aten operations as eager, only traced, so a compiled step equals an eager one to the bit, and torch's
  compiled DDP equals torch's eager DDP (plain averaging on 2 ranks: x 1/2 is exact). With Inductor the
  kernels fuse differently from eager and the oracle is torch's compiled DDP itself (docs/ddp.md, *Compiled*);
* **graph breaks**: Dynamo's own count (``counters["graph_break"]``), for ``torch.compile(wrapper)``, against
  the same model compiled alone;
* **overlap**: the order of events on the training thread in a profiled step: a gradient's ``all_reduce``
  queued before backward's last matrix multiply means a bucket left while backward still had work. It is an
  order in program order on one thread, not a timing: it holds on any machine. Without the cut (Dynamo's
  ``optimize_ddp`` off) every ``all_reduce`` follows the whole compiled backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from minddp import launch

WIDTH, DEPTH, STEPS = 512, 4, 3  # 1 MiB weights: several pieces at torch's smallest cap (1 MiB)
BACKEND = "aot_eager"


class MLP(nn.Module):
    """A model of our own class: Dynamo compiles its frames (it skips torch.nn's own, as an nn.Sequential's)."""

    def __init__(self, graph_break: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 1)
        self.graph_break = graph_break

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        if self.graph_break:
            torch._dynamo.graph_break()  # the user's own break (outside the loop: one there skips the whole frame)
        return self.head(x)


def train(wrap, compile_how: str | None, steps: int = STEPS, split: bool = True, graph_break: bool = False):
    """``steps`` SGD steps on this rank's batches; the parameters, Dynamo's counts, the last step's events."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.config.optimize_ddp = split
    model = MLP(graph_break)
    inner = torch.compile(model, backend=BACKEND) if compile_how == "model" else model
    wrapped = wrap(inner)
    if compile_how == "wrapper":
        wrapped = torch.compile(wrapped, backend=BACKEND)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    events = []
    for step in range(steps):
        x = torch.randn(16, WIDTH, generator=generator)
        with torch.profiler.profile() if step == steps - 1 else _nothing() as prof:
            wrapped(x).square().mean().backward()
            finish = getattr(wrapped, "finish_gradient_synchronization", None)
            if finish is not None:
                finish()
        optimizer.step()
        optimizer.zero_grad()
    events = [(e.time_range.start, e.name) for e in prof.events() if e.thread == _training_thread(prof)]
    torch._dynamo.config.optimize_ddp = True
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "breaks": sum(counters["graph_break"].values()),
        "pieces": counters["aot_autograd"]["total"],  # compiled graphs: pieces of the cut graph
        "sent_before_last_matmul": _sent_before_last_matmul(events),
    }


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _training_thread(prof) -> int:
    return next(e.thread for e in prof.events() if e.name == "aten::mm")


def _sent_before_last_matmul(events) -> bool | None:
    """Was a gradient's all_reduce queued before the step's last matrix multiply (None: no all_reduce)?"""
    events = sorted(events)
    sends = [t for t, name in events if name == "c10d::allreduce_"]
    matmuls = [t for t, name in events if name == "aten::mm"]
    return None if not sends else sends[0] < matmuls[-1]


def on_rank() -> dict:
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from minddp import AsyncBucketDDP, BucketDDP, DistributedDataParallel

    cap = 1.0  # MiB: torch's DDPOptimizer refuses less
    out = {
        "eager": train(lambda m: DistributedDataParallel(m, bucket_cap_mb=cap), None),
        "ddp(compiled)": train(lambda m: DistributedDataParallel(m, bucket_cap_mb=cap), "model"),
        "torch(compiled)": train(lambda m: TorchDDP(m, bucket_cap_mb=cap), "model"),
        "compiled(ddp)": train(lambda m: DistributedDataParallel(m, bucket_cap_mb=cap), "wrapper"),
        "ddp(compiled), no cut": train(lambda m: DistributedDataParallel(m, bucket_cap_mb=cap), "model", split=False),
        # below torch's smallest cap, where torch refuses to compile its DDP
        "compiled(bucket-async)": train(lambda m: AsyncBucketDDP(m, bucket_cap_mb=0.5), "wrapper"),
        "compiled(bucket)": train(lambda m: BucketDDP(m, bucket_cap_mb=0.5), "wrapper"),
        "model alone, a break": train(lambda m: m, "wrapper", steps=1, graph_break=True),
        "compiled(ddp), a break": train(lambda m: DistributedDataParallel(m), "wrapper", steps=1, graph_break=True),
    }
    try:
        train(lambda m: TorchDDP(m, bucket_cap_mb=0.5), "model", steps=1)
        out["torch below 1 MiB"] = "trained"
    except Exception as exc:  # noqa: BLE001 - what torch raises is the point
        out["torch below 1 MiB"] = str(exc)
    for result in out.values():
        if isinstance(result, dict):
            result.pop("params") if dist.get_rank() else None
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(on_rank, world_size=2, timeout_s=300)[0]


def same_bits(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))


def test_compiled_ddp_trains_as_eager_and_as_torchs_compiled_ddp(runs):
    assert same_bits(runs["ddp(compiled)"], runs["eager"])
    assert same_bits(runs["ddp(compiled)"], runs["torch(compiled)"])
    assert same_bits(runs["compiled(ddp)"], runs["torch(compiled)"])


def test_compiled_bucketed_stages_train_as_torchs_compiled_ddp(runs):
    # buckets group the same element-wise average differently: on 2 ranks every grouping gives the same bits
    assert same_bits(runs["compiled(bucket-async)"], runs["torch(compiled)"])
    assert same_bits(runs["compiled(bucket)"], runs["torch(compiled)"])


def test_no_graph_break_of_minddps_making(runs):
    for name in ("ddp(compiled)", "compiled(ddp)", "compiled(bucket-async)", "compiled(bucket)"):
        assert runs[name]["breaks"] == 0, name
    # the user's own break is counted once, as when the model is compiled alone
    assert runs["model alone, a break"]["breaks"] == 1
    assert runs["compiled(ddp), a break"]["breaks"] == runs["model alone, a break"]["breaks"]


def test_the_graph_is_cut_where_buckets_fill(runs):
    # 4 MiB of weights at 1 MiB: DDPOptimizer's pieces, the same for minddp and torch
    assert runs["ddp(compiled)"]["pieces"] == runs["torch(compiled)"]["pieces"] > 1
    assert runs["compiled(ddp)"]["pieces"] == runs["torch(compiled)"]["pieces"]
    assert runs["ddp(compiled), no cut"]["pieces"] == 1
    # below 1 MiB torch refuses to compile its DDP; minddp cuts there too (each 1 MiB layer a piece of its own)
    assert "First bucket should be smaller" in runs["torch below 1 MiB"]
    assert runs["compiled(bucket-async)"]["pieces"] == runs["compiled(bucket)"]["pieces"] == DEPTH


def test_buckets_leave_while_compiled_backward_still_computes(runs):
    for name in ("ddp(compiled)", "compiled(ddp)", "torch(compiled)", "compiled(bucket-async)", "eager"):
        assert runs[name]["sent_before_last_matmul"] is True, name
    # the control: one compiled backward hands every gradient over at its end
    assert runs["ddp(compiled), no cut"]["sent_before_last_matmul"] is False
