"""``broadcast_buffers``: rank 0's buffers (e.g. BatchNorm running stats) before a forward, as torch does.

Two choices, both torch's:

1. **when**: only before the first forward after a *synced* forward (torch's
   ``require_forward_param_sync``): once per optimizer step under
   ``no_sync()`` accumulation, not once per micro-batch. The micro-batches of
   one step then update each rank's running stats locally, exactly as in
   torch's DDP;
2. **how**: one collective per dtype, not one per buffer: the buffers are
   packed into a flat tensor, broadcast, and copied back (torch's
   ``_broadcast_coalesced``). A rotary-embedding model has two tiny buffers;
   sending each alone costs two round trips per forward.

Example::

    >>> broadcast_coalesced(list(module.buffers()), group)   # every rank now holds rank 0's buffers
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from minddp.comm import wire


@torch.no_grad()
def broadcast_coalesced(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Overwrite ``tensors`` with rank 0's values: one broadcast per dtype (step 2)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    src = wire.src_rank(group)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors([t.data for t in same])
        dist.broadcast(flat, src=src, group=group)
        for t, value in zip(same, _unflatten_dense_tensors(flat, same)):
            t.data.copy_(value)
