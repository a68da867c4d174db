"""``broadcast_buffers``: rank 0's buffers (e.g. BatchNorm running stats) before a forward, as torch does.

Two choices, both torch's:

1. **when**: only before the first forward after a *synced* forward (torch's
   ``require_forward_param_sync``): once per optimizer step under
   ``no_sync()`` accumulation, not once per micro-batch. The micro-batches of
   one step update each rank's running stats locally, exactly as in torch;
2. **how**: one collective per dtype, not one per buffer: the buffers are
   packed into a flat tensor, broadcast, and copied back. A rotary-embedding
   model has two tiny buffers; sending each alone costs two round trips per
   forward.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> module = torch.nn.BatchNorm1d(3)                      # running mean, variance, batch count
    >>> broadcast_coalesced(list(module.buffers()), None)      # every rank now holds rank 0's buffers
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.comm.plain import broadcast


@torch.no_grad()
def broadcast_coalesced(tensors: list[torch.Tensor], group: dist.ProcessGroup, src: int = 0) -> None:
    """Overwrite ``tensors`` with group rank ``src``'s values (rank 0's by default): one broadcast per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        broadcast(flat, group_src=src, group=group)
        for t, value in zip(same, flat.split([t.numel() for t in same])):
            t.copy_(value.view_as(t))
