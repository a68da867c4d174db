"""Ring and naive reduce-scatter and all-gather against torch's own (the oracle), and all_reduce = the two.

Torch's ``reduce_scatter_single`` / ``all_gather_single`` on gloo (through
:mod:`minddp.runtime.compat`: ``reduce_scatter_tensor`` / ``all_gather_into_tensor``
before torch 2.13) are the oracle. Integer-valued inputs make every dtype's
sum exact, so the results must agree bit for bit whatever the summation order;
piece sizes include 0, 1 and sizes not divisible by anything. Through a :class:`~minddp.comm.wire.Wire`
(torch's transport and the ring), the meter counts each call by collective.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_collectives import sum_rounding_bound

from minddp import launch
from minddp.collectives import NO_COMMUNICATION, TRANSPORTS
from minddp.collectives.halves import halves_all_reduce
from minddp.collectives.ring import all_gather_pieces, reduce_scatter_pieces
from minddp.comm.wire import Traffic, Wire
from minddp.runtime.compat import all_gather_single, reduce_scatter_single

PIECES = [0, 1, 2, 5, 13, 300]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]


def compare_on_rank() -> list[str]:
    rank, n, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    bad = []
    for name in ("ring", "naive"):
        transport = TRANSPORTS[name]
        for piece in PIECES:
            for dtype in DTYPES:
                g = torch.Generator().manual_seed(100 * rank + piece)
                whole = torch.randint(-8, 9, (n * piece,), generator=g).to(dtype)
                kept = whole.clone()
                ours, ref = torch.empty(piece, dtype=dtype), torch.empty(piece, dtype=dtype)
                transport.reduce_scatter(ours, whole, group)
                reduce_scatter_single(ref, whole, group=group)
                if not torch.equal(ours, ref) or not torch.equal(whole, kept):
                    bad.append(
                        f"{name} reduce_scatter piece={piece} {dtype}: {ours.tolist()[:4]} vs {ref.tolist()[:4]}"
                    )
                mine = torch.randint(-8, 9, (piece,), generator=g).to(dtype)
                ours, ref = torch.empty(n * piece, dtype=dtype), torch.empty(n * piece, dtype=dtype)
                transport.all_gather(ours, mine, group)
                all_gather_single(ref, mine, group=group)
                if not torch.equal(ours, ref):
                    bad.append(f"{name} all_gather piece={piece} {dtype}: {ours.tolist()[:4]} vs {ref.tolist()[:4]}")
        # Floats: within rounding (the ring adds in another order than gloo).
        whole = torch.randn(n * 37, generator=torch.Generator().manual_seed(rank))
        ours, ref = torch.empty(37), torch.empty(37)
        transport.reduce_scatter(ours, whole, group)
        reduce_scatter_single(ref, whole, group=group)
        # two sums of n float32 terms in different orders: within 2·γ_{n−1}·Σ|terms| (test_collectives'
        # sum_rounding_bound), this rank's piece of it
        bound = sum_rounding_bound(whole, group).view(n, 37)[rank]
        if float(((ours - ref).abs() - bound).max()) > 0:
            bad.append(f"{name} reduce_scatter float: max diff {(ours - ref).abs().max()}")
    # ... and with torch's own two collectives (notebook 06's exercise answer), any length
    for size in (1, 7, 64):
        x = torch.randint(-8, 9, (size,), generator=torch.Generator().manual_seed(rank + size)).float()
        ours, ref = x.clone(), x.clone()
        halves_all_reduce(ours, group)
        dist.all_reduce(ref)
        if not torch.equal(ours, ref):
            bad.append(f"halves_all_reduce size={size}: {ours.tolist()[:4]} vs {ref.tolist()[:4]}")
    # all_reduce is reduce-scatter then all-gather, chunk for chunk (uneven chunks included).
    x = torch.randint(-8, 9, (11,), generator=torch.Generator().manual_seed(rank)).float()
    chunks = list(x.clone().tensor_split(n))
    reduce_scatter_pieces(chunks, group)
    all_gather_pieces(chunks, group)
    ref = x.clone()
    dist.all_reduce(ref)
    if not torch.equal(torch.cat(chunks), ref):
        bad.append(f"reduce-scatter + all-gather != all_reduce: {torch.cat(chunks).tolist()} vs {ref.tolist()}")
    # Through the wire: torch's transport and the ring, metered by collective.
    for transport in (None, TRANSPORTS["ring"]):
        traffic = Traffic()
        wire = Wire(None, transport=transport, traffic=traffic)
        whole = torch.arange(4.0 * n) + rank
        shard = wire.reduce_scatter(torch.empty(4), whole).wait()
        expected = torch.arange(4.0 * n).view(n, 4)[rank] * n + sum(range(n))
        gathered = torch.empty(4 * n)
        held = wire.all_gather(gathered, shard).wait()  # as torch's own Futures: [output]
        if held[0].data_ptr() != gathered.data_ptr():
            bad.append(f"wire {transport}: all_gather's Future holds another tensor than the output")
        if not torch.equal(shard, expected) or not torch.equal(gathered.view(n, 4)[rank], expected):
            bad.append(f"wire {transport}: shard {shard.tolist()}, gathered {gathered.tolist()}")
        if traffic.by_op != {"reduce_scatter": (1, 16 * n), "all_gather": (1, 16 * n)} or traffic.calls != 2:
            bad.append(f"wire {transport} counted {traffic.by_op}")
    # The no-communication transport: right shapes, own data only.
    out = torch.empty(3)
    NO_COMMUNICATION.reduce_scatter(out, torch.arange(3.0 * n), group)
    if not torch.equal(out, torch.arange(3.0 * n).view(n, 3)[rank]):
        bad.append(f"no-communication reduce_scatter kept {out.tolist()}")
    # Wrong sizes: one line naming the fix, raised before any message is sent.
    try:
        TRANSPORTS["ring"].reduce_scatter(torch.empty(3), torch.empty(3 * n + 1), group)
        bad.append("ring reduce_scatter took an input that is not world_size pieces")
    except ValueError as exc:
        if "pieces" not in str(exc):
            bad.append(f"unclear size error: {exc}")
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_and_naive_reduce_scatter_and_all_gather_equal_torch(world_size):
    results = launch(compare_on_rank, world_size=world_size, backend="gloo", timeout_s=60)
    for rank, bad in enumerate(results):
        assert bad == [], f"rank {rank}: {bad}"
