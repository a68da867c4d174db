"""Collectives written from point-to-point messages, selectable as the wire's transport.

``TRANSPORTS`` maps a name to a :class:`Transport` (``None`` = torch's own
collectives): an algorithm's three collectives, called by the
:class:`~minddp.comm.wire.Wire` a comm hook or a sharded stage sends through.
The train command's ``--collective`` chooses from it:

* ``ring`` (:mod:`ring`): reduce-scatter and all-gather between neighbours;
  all_reduce is the two one after the other, ``2 (n - 1) / n · bytes`` sent
  per rank, what NCCL and gloo do for large tensors;
* ``naive`` (:mod:`naive`): everything through rank 0, for contrast.

:data:`NO_COMMUNICATION` is a transport that sends nothing (each rank keeps
what it has): the no-communication limit the benchmark compares the sharded
stages with, as ``noop_hook`` is for the DDP stages. It trains nothing
useful, so it is not offered to ``--collective``.

``python -m minddp.bench collectives --transports ring,naive`` measures them against gloo's own.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.comm.wire import Wire
    >>> wire = Wire(None, transport=TRANSPORTS["ring"])     # a hook's state: its sums go round a ring
    >>> wire.all_reduce(torch.arange(4.0)).wait()
    tensor([0., 1., 2., 3.])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from minddp.collectives.naive import naive_all_gather, naive_all_reduce, naive_reduce_scatter
from minddp.collectives.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter


@dataclass(frozen=True)
class Transport:
    """One algorithm's collectives. Calling it is its all_reduce: ``transport(tensor, group)``."""

    name: str
    all_reduce: Callable[[torch.Tensor, dist.ProcessGroup], None]  # in place
    reduce_scatter: Callable[[torch.Tensor, torch.Tensor, dist.ProcessGroup], None]  # (output, input, group)
    all_gather: Callable[[torch.Tensor, torch.Tensor, dist.ProcessGroup], None]  # (output, input, group)

    @property
    def __name__(self) -> str:  # what the wire and hook labels print
        return self.name

    def __call__(self, tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
        self.all_reduce(tensor, group)


def _keep_own_chunk(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    output.copy_(input.reshape(-1).chunk(dist.get_world_size(group))[dist.get_rank(group)].view_as(output))


def _own_piece_everywhere(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    for piece in output.view(-1).chunk(dist.get_world_size(group)):
        piece.copy_(input.reshape(-1))


TRANSPORTS: dict = {
    "torch": None,
    "ring": Transport("ring", ring_all_reduce, ring_reduce_scatter, ring_all_gather),
    "naive": Transport("naive", naive_all_reduce, naive_reduce_scatter, naive_all_gather),
}

#: Sends nothing: all_reduce leaves the tensor, reduce-scatter keeps this rank's own chunk, all-gather
#: repeats this rank's piece. Right shapes, no communication (the benchmark's no-communication limit).
NO_COMMUNICATION = Transport("none", lambda tensor, group: None, _keep_own_chunk, _own_piece_everywhere)

__all__ = [
    "TRANSPORTS",
    "NO_COMMUNICATION",
    "Transport",
    "ring_all_reduce",
    "ring_reduce_scatter",
    "ring_all_gather",
    "naive_all_reduce",
    "naive_reduce_scatter",
    "naive_all_gather",
]
