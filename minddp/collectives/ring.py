"""Ring all_reduce: reduce-scatter, then all-gather, each rank talking only to its neighbours.

Cut the tensor into ``n`` chunks (``n`` = world size; sizes may differ by one
element when ``n`` does not divide the length). Rank ``r`` sends to
``r + 1`` and receives from ``r - 1`` (mod ``n``):

1. **reduce-scatter**, ``n - 1`` steps: at step ``s`` rank ``r`` sends chunk
   ``r - s`` and receives chunk ``r - s - 1``, which it adds into its own copy.
   A chunk travels once around the ring picking up every rank's share, so
   after the last step rank ``r`` holds the full sum of chunk ``r + 1``;
2. **all-gather**, ``n - 1`` steps: at step ``s`` rank ``r`` sends chunk
   ``r + 1 - s`` (a finished sum) and receives chunk ``r - s``, which it
   overwrites. After the last step every rank holds every finished chunk.

Cost model. Each step moves one chunk (``bytes / n``) out of and one into each
rank, and there are ``2 (n - 1)`` steps, so every rank sends

    2 (n - 1) / n · bytes

whatever ``n`` is: bandwidth-optimal, and the load is the same on every link
(no rank is a hot spot, unlike :mod:`naive`). The price is latency:
``2 (n - 1)`` message round trips, which dominate for small tensors; that is
why DDP buckets gradients before reducing them.

Summation order differs from the backend's own all_reduce, so float results
can differ in the last bits (integers in range, as in the tests, are exact).

Example::

    >>> t = torch.full((5,), float(dist.get_rank()))
    >>> ring_all_reduce(t, dist.group.WORLD)      # t is now the sum over ranks
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.collectives.p2p import exchange, ranks_to_reduce


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Sum ``tensor`` in place over ``group`` with the ring algorithm (module doc)."""
    n = ranks_to_reduce(tensor, group, "ring_all_reduce")
    if n == 1:
        return
    rank = dist.get_rank(group)
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = list(tensor.view(-1).tensor_split(n))     # views: writing a chunk writes the tensor
    inbox = torch.empty_like(chunks[0])                # chunk 0 is the largest

    for s in range(n - 1):                                                        # step 1
        send_i, recv_i = (rank - s) % n, (rank - s - 1) % n
        incoming = inbox[:chunks[recv_i].numel()]
        exchange(chunks[send_i], right, incoming, left, group)
        chunks[recv_i] += incoming

    for s in range(n - 1):                                                        # step 2
        send_i, recv_i = (rank + 1 - s) % n, (rank - s) % n
        exchange(chunks[send_i], right, chunks[recv_i], left, group)  # receive straight into place
