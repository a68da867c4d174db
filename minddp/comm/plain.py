"""The plain calls every teaching stage makes: the same start (broadcast) and the average (all_reduce).

1. :func:`broadcast`: every rank's tensor becomes group rank ``group_src``'s (a stage's same start);
2. :func:`allreduce_hook`, the comm hook a stage uses unless told otherwise: divide a bucket of gradients by
   the world size, start summing it across ranks (:meth:`Group.all_reduce`), hand back the Future at once.

A hook's state is, as in torch, a process group (``None``: the default); :class:`Group` is that group as a
hook sees it. A :class:`~minddp.comm.wire.Wire` is a ``Group`` that also meters and delays what it carries; it
consults the device rule and torch's release differences, so this path needs neither (``docs/layout.md``).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.full((3,), 2.0)
    >>> broadcast(p.data)                                       # rank 0's values, on every rank
    >>> allreduce_hook(None, GradBucket(0, p.grad.view(-1), [p], is_last=True)).wait()     # the mean
    tensor([2., 2., 2.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.comm.grad_bucket import GradBucket


def broadcast(tensor: torch.Tensor, group: dist.ProcessGroup | None = None, group_src: int = 0) -> None:
    """Overwrite ``tensor`` with group rank ``group_src``'s, on every rank of ``group`` (``None``: all)."""
    # a complex tensor travels as its real view (the same memory): torch 2.6's gloo refuses complex ones
    real = torch.view_as_real(tensor) if tensor.is_complex() else tensor
    dist.broadcast(real, group_src=group_src, group=group)


def allreduce_hook(state: dist.ProcessGroup | Group | None, bucket: GradBucket) -> torch.futures.Future:
    """Average the bucket across ranks: divide by the world size, then sum."""
    group = Group.of(state)
    tensor = bucket.buffer().div_(group.size())
    return group.all_reduce(tensor)


class Group:
    """A process group as a comm hook sees it: its size, and an all_reduce that hands back a Future."""

    __slots__ = ("group",)

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = resolve_group(group)

    @classmethod
    def of(cls, state) -> Group:
        """The group a hook's state stands for: one of ours (a ``Wire`` too) as it is, else ``cls(state)``."""
        return state if isinstance(state, cls) else cls(state)

    def size(self) -> int:
        return self.group.size()

    def all_reduce(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start summing ``tensor`` in place across the group; a Future of ``tensor`` once summed.

        torch's all_reduce returns at once and sums on the backend's own threads:
        that is what lets communication overlap the rest of backward.
        """
        return when_done(dist.all_reduce(tensor, group=self.group, async_op=True), tensor)


def resolve_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``None`` means the default (world) group; the one place that says so."""
    if group is None and not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: start ranks with minddp.launch(...) "
            "or torchrun, or call torch.distributed.init_process_group first"
        )
    return dist.group.WORLD if group is None else group


def when_done(work, value) -> torch.futures.Future:
    """A Future of ``value`` once the collective ``work`` has finished; it raises on ``wait()`` if that failed."""

    def finished(done: torch.futures.Future):
        done.value()  # raises here if the collective failed
        return value

    return work.get_future().then(finished)
