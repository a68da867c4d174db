"""Naive (star) collectives: everything goes through rank 0, for contrast with :mod:`ring`.

All_reduce, the textbook version:

1. **reduce**: every rank ``r > 0`` sends its whole tensor to rank 0, which
   adds each one in;
2. **broadcast**: rank 0 sends the finished sum to every other rank.

Reduce-scatter and all-gather go the same way: rank 0 collects everything,
then sends each rank what it should end with (its chunk of the sum; the
whole gathered tensor).

Cost model (notebook 01's notation: ``n`` ranks, a tensor of ``m`` bytes,
``α`` per message, ``β`` per byte). Ranks ``r > 0`` send and receive ``m``
once each, but rank 0 receives ``(n - 1) · m`` and sends ``(n - 1) · m``:
``n / 2`` times a ring rank's ``2 (n - 1) / n · m`` each way, and the others
wait on it. Its ``2 (n - 1)`` messages, the ring's count, each carry a whole
tensor one way (it receives everything before it sends), so it takes
``2 (n - 1) α + 2 (n - 1) · m β``: ``n`` times the ring's ``β`` term.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> t = torch.arange(3.0)
    >>> naive_all_reduce(t, None)                 # t is now the sum over ranks
    >>> t
    tensor([0., 1., 2.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.collectives.p2p import check_sizes, exchange, ranks_to_reduce


def naive_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Sum ``tensor`` in place over ``group`` through rank 0 (module doc)."""
    n = ranks_to_reduce(tensor, group, "naive_all_reduce")
    if n == 1:
        return
    rank = dist.get_rank(group)
    if rank == 0:
        inbox = torch.empty_like(tensor)
        for r in range(1, n):  # step 1
            exchange(None, r, inbox, r, group)
            tensor += inbox
        for r in range(1, n):  # step 2
            exchange(tensor, r, None, r, group)
    else:
        exchange(tensor, 0, None, 0, group)  # step 1
        exchange(None, 0, tensor, 0, group)  # step 2


def naive_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``output`` = this rank's chunk of the sum of ``input``: rank 0 sums everything, then hands out chunks."""
    n = check_sizes(output, input, group, "naive_reduce_scatter", output_is_whole=False)
    rank = dist.get_rank(group)
    if rank == 0:
        total, inbox = input.reshape(-1).clone(), torch.empty_like(input.reshape(-1))
        for r in range(1, n):
            exchange(None, r, inbox, r, group)
            total += inbox
        chunks = total.chunk(n)
        for r in range(1, n):
            exchange(chunks[r], r, None, r, group)
        output.view(-1).copy_(chunks[0])
    else:
        exchange(input.reshape(-1), 0, None, 0, group)
        exchange(None, 0, output.view(-1), 0, group)


def naive_all_gather(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``output`` = every rank's ``input`` in rank order: rank 0 collects the pieces, then sends the whole."""
    n = check_sizes(output, input, group, "naive_all_gather", output_is_whole=True)
    rank = dist.get_rank(group)
    pieces = output.view(-1).chunk(n)
    pieces[rank].copy_(input.reshape(-1))
    if rank == 0:
        for r in range(1, n):
            exchange(None, r, pieces[r], r, group)
        for r in range(1, n):
            exchange(output, r, None, r, group)
    else:
        exchange(pieces[rank], 0, None, 0, group)
        exchange(None, 0, output, 0, group)
