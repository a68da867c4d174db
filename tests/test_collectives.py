"""The hand-written collectives against torch's own all_reduce (the oracle), 1 to 4 ranks.

Sizes include lengths below and not divisible by the world size (empty and
uneven ring chunks). Integer-valued inputs make every dtype's sum exact, so
ring, naive and gloo must agree bit for bit whatever their summation order;
a float input checks fp32 within rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from minddp import launch
from minddp.collectives import TRANSPORTS
from minddp.comm.wire import Traffic, Wire

SIZES = [1, 2, 3, 5, 7, 64, 1001]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def sum_rounding_bound(x: torch.Tensor, group) -> torch.Tensor:
    """Per element, how far two float32 sums of the ranks' ``x`` in different orders may be apart.

    A sum of n terms in any order is within γ_{n−1}·Σ|x_r| of the exact sum (γ_k = k·u/(1 − k·u),
    u = 2**-24, each addition's relative rounding; no term here is subnormal); two such sums, within twice
    that of each other. The ring adds in another order than gloo, and gloo's order may change between
    releases: this holds for any order.
    """
    n = dist.get_world_size(group)
    magnitude = x.abs()
    dist.all_reduce(magnitude, group=group)
    gamma = (n - 1) * 2.0**-24 / (1 - (n - 1) * 2.0**-24)
    return 2 * gamma * magnitude * (1 + 2.0**-23)  # (the bound's own float32 rounding, upwards)


def compare_on_rank() -> list[str]:
    """Return a description of every (transport, size, dtype) whose result differs from dist.all_reduce."""
    rank = dist.get_rank()
    group = dist.group.WORLD
    bad = []
    for name in ("ring", "naive"):
        fn = TRANSPORTS[name]
        for size in SIZES:
            for dtype in DTYPES:
                g = torch.Generator().manual_seed(1000 * rank + size)
                x = torch.randint(-8, 9, (size,), generator=g).to(dtype)
                ours, ref = x.clone(), x.clone()
                fn(ours, group)
                dist.all_reduce(ref, group=group)
                if not torch.equal(ours, ref):
                    bad.append(f"{name} size={size} {dtype}: {ours.tolist()[:5]} vs {ref.tolist()[:5]}")
            x = torch.randn(size, 3, generator=torch.Generator().manual_seed(rank))  # 2-D, float
            ours, ref = x.clone(), x.clone()
            fn(ours, group)
            dist.all_reduce(ref, group=group)
            excess = (ours - ref).abs() - sum_rounding_bound(x, group)
            if excess.numel() and float(excess.max()) > 0:
                bad.append(f"{name} size={size}x3 float32 randn: max diff {(ours - ref).abs().max()}")
    # Through the wire, as a comm hook would use it: same result, and the meter counts the call.
    traffic = Traffic()
    t = torch.arange(10.0) * (rank + 1)
    Wire(None, transport=TRANSPORTS["ring"], traffic=traffic).all_reduce(t).wait()
    if traffic.calls != 1 or traffic.bytes != 40:
        bad.append(f"wire counted {traffic.calls} calls and {traffic.bytes} bytes for one ring all_reduce of 40")
    n = dist.get_world_size()
    if not torch.equal(t, torch.arange(10.0) * (n * (n + 1) // 2)):
        bad.append(f"wire+ring gave {t.tolist()}")
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_and_naive_equal_torch_all_reduce(world_size):
    results = launch(compare_on_rank, world_size=world_size, backend="gloo", timeout_s=60)
    for rank, bad in enumerate(results):
        assert bad == [], f"rank {rank}: {bad}"


def test_transports_registry_names():
    assert TRANSPORTS["torch"] is None
    assert callable(TRANSPORTS["ring"]) and callable(TRANSPORTS["naive"])


def watch_on_rank():
    from minddp.collectives.watch import watch

    return watch("ring", numel=3 * 5), watch("naive", numel=3 * 5)


def test_the_watched_ring_sends_what_its_doc_says_and_is_priced_by_the_link_model():
    """Notebook 01's drawing comes from these records: they must be the schedule ring.py's docstring states
    (reduce-scatter step s: rank r sends chunk r - s - 1 to r + 1; all-gather: chunk r - s), the marks must
    show each chunk gathering one share per hop, and the α-β price of what was sent must be the link model's
    ring formula (a different oracle: minddp.comm.link's table), the star's (n - 1) B at rank 0."""
    from minddp.collectives.watch import ranks_in, ring_facts, seconds
    from minddp.comm.link import PRESETS

    n, numel = 3, 15
    ring, star = launch(watch_on_rank, world_size=n, backend="gloo", timeout_s=60)[0]
    B, chunk = numel * 4, numel // n * 4
    for r in ring:
        rank = r["rank"]
        assert r["ok"] and r["after"] == [2**n - 1] * n
        assert [s["chunks"] for s in r["exchanges"]] == [[(rank - s - 1) % n] for s in range(n - 1)] + [
            [(rank - s) % n] for s in range(n - 1)
        ]
        assert {s["to"] for s in r["exchanges"]} == {(rank + 1) % n} and r["sent"] == 2 * (n - 1) * chunk
        # after the reduce-scatter (the state before the first all-gather step), chunk `rank` holds every share
        assert ranks_in(r["exchanges"][n - 1]["before"][rank]) == list(range(n))
        # the chunk sent at reduce-scatter step s carries s + 1 ranks' shares
        assert [len(ranks_in(s["before"][s["chunks"][0]])) for s in r["exchanges"][: n - 1]] == list(range(1, n))
    assert star[0]["sent"] == star[0]["received"] == (n - 1) * B
    assert all(r["sent"] == r["received"] == B and r["ok"] for r in star[1:])
    link = PRESETS["1gbit"]
    # seconds() adds 2 (n - 1) terms in another order than the formula: float64 rounding, far below 1e-9
    assert seconds(ring, link) == pytest.approx(link.seconds("all_reduce", B, n), rel=1e-9)
    assert seconds(star, link) == pytest.approx(2 * (n - 1) * (link.latency + B / link.bandwidth), rel=1e-9)
    # notebook 01's claims on the drawing hold on these records, and each fails when its fact is broken
    assert [holds for holds, _ in ring_facts(ring)] == [True] * 4
    assert "rank 0: chunk 0, rank 1: chunk 1, rank 2: chunk 2" in ring_facts(ring)[1][1]
    broken = copy.deepcopy(ring)
    first = broken[0]["exchanges"][0]
    first["before"][first["chunks"][0]] = 2**n - 1  # the first chunk sent already complete: not one mark
    assert [holds for holds, _ in ring_facts(broken)] == [False, True, True, True]
    broken = copy.deepcopy(ring)
    broken[1]["exchanges"][n - 1]["before"] = [2**n - 1] * n  # rank 1 complete in every chunk after reduce-scatter
    assert [holds for holds, _ in ring_facts(broken)][1:3] == [False, False]
    broken = copy.deepcopy(ring)
    broken[2]["after"][0] = 1  # rank 2 ends with a partial chunk
    assert [holds for holds, _ in ring_facts(broken)] == [True, True, False, False]
