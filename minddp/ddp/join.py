"""Uneven inputs (``DistributedDataParallel.join()``): what a rank does once it has run out of batches.

torch's ``Join`` context manager drives the protocol: every forward of a rank still training starts
with an all_reduce of 1; a rank that has left its loop answers with 0 and, while the count is not 0,
runs :meth:`ShadowingJoinHook.main_hook` once per step of the others, issuing exactly the collectives
a training rank issues, in the same order: 1. the plan rebuild's broadcast (once); 2. the buffer
broadcast, from the highest rank still training; 3. the "does this backward sync?" flag; 4. if it
does, every bucket with zeros, then the unused-parameter bitmap. At the end,
:meth:`ShadowingJoinHook.post_hook` gives every rank the last joiner's model. More: ``docs/ddp.md``
(Uneven inputs).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import DistributedDataParallel
    >>> ddp = DistributedDataParallel(torch.nn.Linear(4, 2))
    >>> optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    >>> with ddp.join():
    ...     for batch in [torch.ones(3, 4)] * 2:         # a different number on each rank
    ...         ddp(batch).sum().backward(); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import JoinHook

from minddp.comm.plain import broadcast
from minddp.runtime import compat


class ShadowingJoinHook(JoinHook):
    """What a joined rank does while others still train: shadow one step's collectives, in the same order."""

    def __init__(self, ddp, divide_by_initial_world_size: bool):
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size

    def main_hook(self) -> None:
        ddp = self.ddp
        ddp.reducer.maybe_rebuild()
        ddp._sync_buffers(joined=True)
        flag = torch.zeros(1, dtype=torch.long, device=ddp._device)
        dist.all_reduce(flag, group=ddp.process_group)
        should_sync = bool(flag.item())
        ddp.require_forward_param_sync = should_sync
        if should_sync:
            ddp.reducer.shadow_backward()
        if ddp.watch is not None:  # debug mode: the others' step counts here too
            ddp.watch.shadowed()

    def post_hook(self, is_last_joiner: bool) -> None:
        """Every rank takes the model of the last rank to join (the highest such rank)."""
        ddp = self.ddp
        source = highest_rank(ddp.process_group, is_last_joiner, ddp._device)
        with torch.no_grad():
            for tensor in [*ddp.module.parameters(), *(ddp.module.buffers() if ddp.broadcast_buffers else [])]:
                broadcast(tensor, group_src=source, group=ddp.process_group)
        compat.join_over(ddp)  # the block has ended on every rank: debug mode's checks resume


def highest_rank(group: dist.ProcessGroup, candidate: bool, device: torch.device) -> int:
    """The highest group rank among those that are candidates (one small all_reduce, every rank agrees)."""
    mine = torch.tensor([dist.get_rank(group) if candidate else -1], device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=group)
    return int(mine.item())
