"""A step read in memory over an emulated link: the messages' modeled time, and where the training thread waited.

The notebooks' claims about waiting rest on :func:`minddp.analysis.live.step_view`
with a link. Oracles independent of timing: *where* a stage waits is fixed by
its code (``hook`` and ``bucket`` wait inside the autograd hook, so inside the
backward, once per message; ``hook-async`` and ``bucket-async`` wait only in
``finish_gradient_synchronization``, after the last backward; ``ga`` after
the last backward); and the link's time is the cost model's
(:meth:`minddp.comm.link.LinkSpec.seconds`) summed over the messages, whose
sizes the stage's parameters and buckets fix.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minddp.runtime.launch import launch

MICRO = 3
STAGES = ["ga", "hook", "hook-async", "bucket", "bucket-async"]


def _look_over_a_link(stages: list[str]) -> dict:
    import torch.distributed as dist

    from minddp.analysis import live
    from minddp.comm.link import Link
    from minddp.comm.wire import Wire
    from minddp.ladder import wrap
    from minddp.ladder.loop import train_step

    g = torch.Generator().manual_seed(dist.get_rank())
    micro = [(torch.randn(16, 64, generator=g), torch.randn(16, 1, generator=g)) for _ in range(MICRO)]

    def loss_fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean()

    out = {}
    for stage in stages:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3)], nn.Linear(64, 1))
        link = Link("100mbit,1ms")
        wrapped = wrap(stage, model, bucket_cap_mb=0.02, wire=Wire(None, link=link))
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        train_step(wrapped, opt, micro, loss_fn)
        link.log.clear()
        link.asked.clear()
        prof = live.profiler()
        with prof:
            train_step(wrapped, opt, micro, loss_fn)
        view = live.step_view(prof, link=link)
        sizes = [m["bytes"] for m in link.log]
        view["model_ms"] = sum(link.seconds("all_reduce", n, 2) for n in sizes) * 1e3
        view["sizes"] = sorted(sizes)
        out[stage] = view
        link.close()
    return out


@pytest.fixture(scope="module")
def looks():
    return launch(_look_over_a_link, STAGES, world_size=2)


def test_a_stage_that_waits_inside_backward_is_told_from_one_that_waits_after_it(looks):
    for seen in looks:  # both ranks: placement is the code's, not timing's
        for stage in ("hook", "bucket"):
            v = seen[stage]
            assert v["calls"] > 1 and v["waits"] == v["calls"] == v["waits_in_backward"], stage
        for stage in ("ga", "hook-async", "bucket-async"):
            v = seen[stage]
            assert v["waits"] == v["calls"] > 1 and v["waits_in_backward"] == 0, stage
        assert seen["hook-async"]["calls"] == seen["hook"]["calls"] > seen["bucket"]["calls"]


def test_the_accumulation_steps_hold_the_grad_hooks_and_their_waits(looks):
    """``accumulate_ms``: the last backward's time in autograd's AccumulateGrad steps, where the grad hooks run. hook
    waits for every message inside its grad hook (the code's placement, as above), so inside those steps: they hold
    all its waited time (to the link clock's placement on the profiler's, 1 ms), and lie inside the backward."""
    for seen in looks:
        hook = seen["hook"]
        assert hook["waited_ms"] > 0 and hook["waited_ms"] - 1.0 <= hook["accumulate_ms"] <= hook["last_backward_ms"]
        for stage, v in seen.items():
            assert 0 < v["accumulate_ms"] <= v["last_backward_ms"], stage


def test_the_link_time_is_the_cost_model_summed_over_the_messages(looks):
    parameters = sorted(
        p.numel() * 4 for p in nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)], nn.Linear(64, 1)).parameters()
    )
    for seen in looks:
        assert seen["hook"]["sizes"] == parameters  # one message per parameter, its own bytes
        assert sum(seen["bucket"]["sizes"]) == sum(parameters)  # the same bytes, in buckets
        for v in seen.values():
            # the view sums LinkSpec.seconds per logged message; the oracle sums it again from the sizes: same floats
            assert v["link_ms"] == pytest.approx(v["model_ms"], rel=1e-12)
            row = v["row"]
            assert len(row["messages"]) == v["calls"] and len(row["backward"]) == MICRO
            assert all(end > start for start, end in row["messages"])  # each message occupies the link a while
