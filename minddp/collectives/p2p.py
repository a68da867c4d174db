"""The two point-to-point moves every hand-written collective here is made of.

Kept apart so that :mod:`ring` and :mod:`naive` read as algorithms, not as
bookkeeping about global ranks, backends and argument checks.

Example (needs two ranks, a rank cannot send to itself: not run by the doctests; ``ring.py``'s
are)::

    >>> exchange(send=mine, dst=right, recv=buf, src=left, group=group)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from minddp.runtime.device import staged


def peer(group: dist.ProcessGroup, group_rank: int) -> int:
    """The global rank of ``group_rank`` (send/recv address peers by global rank)."""
    return group_rank if group is dist.group.WORLD else dist.get_global_rank(group, group_rank)


def exchange(
    send: torch.Tensor | None, dst: int, recv: torch.Tensor | None, src: int, group: dist.ProcessGroup
) -> None:
    """Send ``send`` to group rank ``dst`` while receiving ``recv`` from ``src``; wait for both.

    Both are posted together in one batch (``batch_isend_irecv``): if every
    rank first did a blocking send, and the transport had no room to buffer
    it, every rank would wait for a receive nobody had posted. ``None`` or an
    empty tensor skips that direction (both ends know the sizes, so they skip
    alike).
    """
    with contextlib.ExitStack() as host:  # gloo sends no CUDA tensor: ranks sharing a GPU go through the CPU
        send = None if send is None else host.enter_context(staged(send, group))
        recv = None if recv is None else host.enter_context(staged(recv, group))
        ops = []
        if send is not None and send.numel() > 0:
            ops.append(dist.P2POp(dist.isend, send, peer(group, dst), group))
        if recv is not None and recv.numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv, peer(group, src), group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()


def ranks_to_reduce(tensor: torch.Tensor, group: dist.ProcessGroup, name: str) -> int:
    """The group's size, after the checks every point-to-point all_reduce needs.

    A group of one has nothing to reduce (the caller returns at once on 1);
    a non-contiguous tensor cannot be split into views that write through.
    """
    if not tensor.is_contiguous():
        raise ValueError(f"{name} needs a contiguous tensor: pass tensor.contiguous() and copy back")
    return dist.get_world_size(group)


def check_sizes(
    output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup, name: str, output_is_whole: bool
) -> int:
    """The group's size, after checking a reduce-scatter's or all-gather's two tensors fit each other.

    The whole tensor (``input`` of a reduce-scatter, ``output`` of an
    all-gather) must hold exactly ``n`` pieces of the other one's size, and
    both must be contiguous, as for torch's ``*_single`` collectives.
    """
    n = dist.get_world_size(group)
    whole, piece = (output, input) if output_is_whole else (input, output)
    if not (output.is_contiguous() and input.is_contiguous()):
        raise ValueError(f"{name} needs contiguous tensors: pass .contiguous() copies")
    if whole.numel() != n * piece.numel() or whole.dtype != piece.dtype:
        raise ValueError(
            f"{name}: the whole tensor must hold {n} (the world size) pieces of the other's size and dtype, "
            f"got {whole.numel()} {whole.dtype} elements for pieces of {piece.numel()} {piece.dtype}; "
            f"size the whole tensor as {n} x the piece (pad it, as the sharded stages do)"
        )
    return n
