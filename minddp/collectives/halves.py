"""all_reduce as torch's own reduce-scatter then torch's own all-gather: the identity, with the backend's collectives.

:mod:`ring` shows the two passes written from point-to-point messages; this
is the same identity with one call each to the process group, the answer to
notebook 06's exercise:

1. pad the flattened tensor to a multiple of the world size (a
   reduce-scatter hands every rank a piece of the same size);
2. ``reduce_scatter_single``: this rank's piece of the sum;
3. ``all_gather_single``: every rank's piece, back into the padded buffer;
4. copy the sum (padding cut) into the tensor.

Both collectives come from :mod:`minddp.runtime.compat`, which calls torch's name for
them (``all_gather_into_tensor`` / ``reduce_scatter_tensor`` before torch 2.13).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> t = torch.arange(3.0)
    >>> halves_all_reduce(t, None)                 # t is now the sum over ranks
    >>> t
    tensor([0., 1., 2.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.runtime.compat import all_gather_single, reduce_scatter_single


def halves_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Sum ``tensor`` in place over ``group`` with a reduce-scatter and an all-gather (module doc)."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % n))  # 1.
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)  # 2.
    all_gather_single(padded, piece, group=group)  # 3.
    tensor.copy_(padded[: flat.numel()].view_as(tensor))  # 4.
