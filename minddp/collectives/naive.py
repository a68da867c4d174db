"""Naive (star) all_reduce: everyone sends to rank 0, rank 0 sums and sends the result back.

The textbook version, for contrast with :mod:`ring`:

1. **reduce**: every rank ``r > 0`` sends its whole tensor to rank 0, which
   adds each one in;
2. **broadcast**: rank 0 sends the finished sum to every other rank.

Cost model. Ranks ``r > 0`` send and receive ``bytes`` once each, but rank 0
receives ``(n - 1) · bytes`` and sends ``(n - 1) · bytes``: its link carries
``2 (n - 1) · bytes``, ``n`` times the ring's ``2 (n - 1) / n · bytes``, and
the others wait on it. Latency is ``2 (n - 1)`` sequential messages at rank 0,
the same count as the ring, but with whole tensors instead of chunks.

Example::

    >>> naive_all_reduce(t, dist.group.WORLD)     # t is now the sum over ranks
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.collectives.p2p import exchange, ranks_to_reduce


def naive_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Sum ``tensor`` in place over ``group`` through rank 0 (module doc)."""
    n = ranks_to_reduce(tensor, group, "naive_all_reduce")
    if n == 1:
        return
    rank = dist.get_rank(group)
    if rank == 0:
        inbox = torch.empty_like(tensor)
        for r in range(1, n):                                                     # step 1
            exchange(None, r, inbox, r, group)
            tensor += inbox
        for r in range(1, n):                                                     # step 2
            exchange(tensor, r, None, r, group)
    else:
        exchange(tensor, 0, None, 0, group)                                       # step 1
        exchange(None, 0, tensor, 0, group)                                       # step 2
