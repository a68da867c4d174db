"""Ring collectives: each rank talks only to its neighbours, and all_reduce = reduce-scatter + all-gather.

Cut the tensor into ``n`` pieces (``n`` = world size); rank ``r`` sends to ``r + 1`` and receives
from ``r - 1`` (mod ``n``). Two passes around the ring:

1. **reduce-scatter** (:func:`reduce_scatter_pieces`), ``n - 1`` steps: each received piece is added
   into the rank's own copy, so at the end rank ``r`` holds the full sum of piece ``r``;
2. **all-gather** (:func:`all_gather_pieces`), ``n - 1`` steps: each rank passes the finished pieces
   on, so at the end every rank holds every piece.

:func:`ring_all_reduce` is the two passes one after the other; the sharded stages use each alone.
Each rank sends ``2(n - 1)/n`` of the bytes, whatever ``n``: bandwidth-optimal, at the price of
``2(n - 1)`` messages in a row. The cost model and measurements: ``docs/ddp.md`` (Collectives from
point-to-point messages). Summation order differs from the backend's, so floats may differ in the
last bits.

Example (one rank here, where the sum is the tensor; every rank runs the same under
:func:`minddp.launch`)::

    >>> t = torch.arange(5.0)
    >>> ring_all_reduce(t, None)                  # t is now the sum over ranks
    >>> t
    tensor([0., 1., 2., 3., 4.])
    >>> shard = torch.empty(4)
    >>> ring_reduce_scatter(shard, torch.ones(4), None)    # this rank's piece of the sum
    >>> shard
    tensor([1., 1., 1., 1.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.collectives.p2p import check_sizes, exchange, ranks_to_reduce


def reduce_scatter_pieces(pieces: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Pass 1: afterwards ``pieces[rank]`` holds the sum over ranks of that piece (the others are partial sums)."""
    n, rank = len(pieces), dist.get_rank(group)
    right, left = (rank + 1) % n, (rank - 1) % n
    inbox = torch.empty_like(max(pieces, key=torch.Tensor.numel))
    for s in range(n - 1):  # step 1
        send_i, recv_i = (rank - s - 1) % n, (rank - s - 2) % n
        incoming = inbox[: pieces[recv_i].numel()]
        exchange(pieces[send_i], right, incoming, left, group)
        pieces[recv_i] += incoming


def all_gather_pieces(pieces: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Pass 2: from ``pieces[rank]`` filled on every rank to every piece filled on every rank."""
    n, rank = len(pieces), dist.get_rank(group)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):  # step 2
        send_i, recv_i = (rank - s) % n, (rank - s - 1) % n
        exchange(pieces[send_i], right, pieces[recv_i], left, group)  # receive straight into place


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Sum ``tensor`` in place over ``group``: reduce-scatter, then all-gather (module doc)."""
    n = ranks_to_reduce(tensor, group, "ring_all_reduce")
    if n == 1:
        return
    pieces = list(tensor.view(-1).tensor_split(n))  # views: writing a piece writes the tensor
    reduce_scatter_pieces(pieces, group)
    all_gather_pieces(pieces, group)


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``output`` = this rank's piece of the sum of ``input`` over ranks (``input`` is ``n`` outputs back to back).

    ``torch.distributed.reduce_scatter_single``'s contract; ``input`` is left as it was.
    """
    n = check_sizes(output, input, group, "ring_reduce_scatter", output_is_whole=False)
    work = input.reshape(-1).clone()  # pass 1 sums in place; the caller's input stays
    pieces = list(work.chunk(n)) if n > 1 else [work]
    reduce_scatter_pieces(pieces, group)
    output.view(-1).copy_(pieces[dist.get_rank(group)])


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``output`` = every rank's ``input``, in rank order (``torch.distributed.all_gather_single``'s contract)."""
    n = check_sizes(output, input, group, "ring_all_gather", output_is_whole=True)
    pieces = list(output.view(-1).chunk(n)) if n > 1 else [output.view(-1)]
    pieces[dist.get_rank(group)].copy_(input.reshape(-1))
    all_gather_pieces(pieces, group)
