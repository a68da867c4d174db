"""The bytes each sharded rung really sends, counted from the point-to-point messages of minddp's ring.

On gloo, torch's transport sends a reduce-scatter as an all_reduce, so what ZeRO-2 saves on the wire
is seen only through a transport whose messages are its own: the ring (``minddp.collectives``), each
collective in a profiler range of its name (``lesson.labelled``), every message counted from gloo's
own send range (``lesson.sent_by_collective``), as notebook 06 does. Three ranks, so that no factor
of the α-β count is 1; a small model of blocks (no Hugging Face import), FSDP's units its blocks.

The oracle is the α-β count of bytes each rank sends, from the parameter sizes alone: a ring
all_reduce of m bytes sends ``2 (n - 1)/n · m``, a reduce-scatter or an all-gather ``(n - 1)/n · m``.
What may separate a measurement from it: the ring's chunks of a tensor differ by one element, and
the sharded rungs pad every parameter's chunks to equal length (fewer than n elements a parameter);
the tolerance allows n elements a tensor a pass, far below any pass of the model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minddp.runtime.launch import launch

WORLD = 3
STAGES = ["ddp", "zero1", "zero2", "fsdp"]


class Blocks(nn.Module):
    """A stem, three blocks (FSDP's units: the elements of a ModuleList) and a head; sizes the ranks do not
    divide evenly, so the padding is exercised."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(7, 31)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(31, 31), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(31, 2)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _sent_through_the_ring(stages: list[str]) -> dict:
    import torch.distributed as dist

    from minddp.collectives import TRANSPORTS
    from minddp.comm.wire import Wire
    from minddp.ladder import make_optimizer, wrap
    from minddp.ladder.loop import train_step
    from minddp.notebook.lesson import labelled, profiled_step

    g = torch.Generator().manual_seed(dist.get_rank())
    batch = [(torch.randn(8, 7, generator=g), torch.randn(8, 2, generator=g))]

    def loss_fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean()

    def step_under(prof):
        with prof:
            train_step(wrapped, optimizer, batch, loss_fn)

    out = {}
    for stage in stages:
        torch.manual_seed(0)
        model = Blocks()
        sizes = [p.numel() for p in model.parameters()]
        wire = Wire(None, transport=labelled(TRANSPORTS["ring"]))
        wrapped = wrap(stage, model, bucket_cap_mb=0.1, wire=wire)
        optimizer = make_optimizer(stage, model, torch.optim.AdamW, wire=wire, lr=1e-3)
        train_step(wrapped, optimizer, batch, loss_fn)  # zero2 gathers at the next step's start
        sent = profiled_step(step_under)["sent"]
        units = [sum(u.numels) for u in getattr(wrapped, "units", [])]
        replicated = sum(p.numel() for _, _, p in getattr(wrapped, "replicated", []))
        out[stage] = {"sent": sent, "sizes": sizes, "units": units, "replicated": replicated}
    return out


@pytest.fixture(scope="module")
def sent():
    return launch(_sent_through_the_ring, STAGES, world_size=WORLD, backend="gloo", timeout_s=180)


def test_zero2_reduce_scatters_half_of_ddps_all_reduce_and_moves_its_bytes(sent):
    n = WORLD
    for rank in sent:  # every rank sends the same share
        psi = sum(rank["ddp"]["sizes"])
        slack = n * len(rank["ddp"]["sizes"]) * 4  # bytes: n elements a tensor (module doc)
        one_pass = (n - 1) / n * 4 * psi  # a reduce-scatter or an all-gather of the fp32 model
        ddp, zero1, zero2 = (rank[s]["sent"] for s in ("ddp", "zero1", "zero2"))
        assert set(ddp) == {"all_reduce"} and ddp["all_reduce"] == pytest.approx(2 * one_pass, abs=2 * slack)
        assert set(zero1) == {"all_reduce", "all_gather"}
        assert zero1["all_reduce"] == ddp["all_reduce"] and zero1["all_gather"] == pytest.approx(one_pass, abs=slack)
        assert set(zero2) == {"reduce_scatter", "all_gather"}
        assert zero2["reduce_scatter"] == pytest.approx(one_pass, abs=slack)
        assert zero2["all_gather"] == pytest.approx(one_pass, abs=slack)


def test_fsdp_gathers_each_unit_for_the_forward_and_all_but_the_last_for_the_backward(sent):
    n = WORLD
    for rank in sent:
        f = rank["fsdp"]
        slack = n * len(f["sizes"]) * 4
        sharded = sum(f["units"])
        assert sharded + f["replicated"] == sum(f["sizes"]) and len(f["units"]) > 1
        assert f["sent"]["reduce_scatter"] == pytest.approx((n - 1) / n * 4 * sharded, abs=slack)
        assert f["sent"]["all_reduce"] == pytest.approx(2 * (n - 1) / n * 4 * f["replicated"], abs=2 * slack)
        gathered = 2 * sharded - f["units"][-1]  # one micro-batch: every unit forward, all but the last backward
        assert f["sent"]["all_gather"] == pytest.approx((n - 1) / n * 4 * gathered, abs=2 * slack)
