"""The wire: a process group as the comm hooks see it, with how its sums travel and who counts them.

A comm hook's state is, as in torch, a process group (``None`` = the default
group). minddp also accepts a :class:`Wire` there: the same group plus two
optional things a learner or a benchmark wants, passed explicitly rather than
set somewhere process-wide:

* a **transport**: ``None`` for torch's own all_reduce (gloo/NCCL), or one of
  minddp's collectives written from point-to-point messages
  (:data:`minddp.collectives.TRANSPORTS`), to watch a ring all_reduce carry
  real gradients;
* a **meter** (:class:`Traffic`): calls and payload bytes of every all_reduce
  the hooks send through this wire, so "bytes on the wire" is measured, not
  estimated. Without one nothing is counted and nothing is paid;
* a **link** (:class:`~minddp.comm.link.Link`): an emulated network under the
  real collective; each all_reduce then completes no earlier than the link's
  modeled time for its size (the result is unchanged).

Every minddp hook sends through ``Wire.of(state).all_reduce(tensor)``, so any
of them can be metered or rerouted by handing it a wire::

    >>> traffic = Traffic()
    >>> model.register_comm_hook(Wire(group, traffic=traffic), allreduce_hook)
    >>> ...one step...
    >>> traffic.calls, traffic.bytes

Bytes are *payload* bytes (``numel * element_size`` of the tensor handed to
all_reduce); what an algorithm moves per rank depends on it (a ring moves
``2 (n-1)/n`` times the payload, see :mod:`minddp.collectives.ring`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

#: ``transport(tensor, group)`` sums ``tensor`` in place across ``group`` and returns when done.
Transport = Callable[[torch.Tensor, dist.ProcessGroup], None]


def resolve_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``None`` means the default (world) group; the one place that says so."""
    if group is not None:
        return group
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: start ranks with minddp.launch(...) "
            "or torchrun, or call torch.distributed.init_process_group first"
        )
    return dist.group.WORLD


@dataclass
class Traffic:
    """What went over one wire since the last :meth:`reset`: all_reduce calls and payload bytes.

    ``error_sq``/``norm_sq`` accumulate ||g - ĝ||² and ||g||² when a hook is
    wrapped in :func:`minddp.comm.measure.error_measured` (an extra exact
    all_reduce per bucket, which is *not* counted here).
    """

    calls: int = 0
    bytes: int = 0
    by_dtype: dict = field(default_factory=dict)
    error_sq: float = 0.0
    norm_sq: float = 0.0

    def record(self, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        self.calls += 1
        self.bytes += nbytes
        self.by_dtype[tensor.dtype] = self.by_dtype.get(tensor.dtype, 0) + nbytes

    def relative_error(self) -> float | None:
        """||g - ĝ|| / ||g|| over everything measured since the reset (None if nothing was)."""
        return (self.error_sq / self.norm_sq) ** 0.5 if self.norm_sq > 0 else None

    def snapshot(self) -> dict:
        by_dtype = {str(dtype).replace("torch.", ""): n for dtype, n in self.by_dtype.items()}
        return {"calls": self.calls, "bytes": self.bytes, "by_dtype": by_dtype,
                "relative_error": self.relative_error()}

    def reset(self) -> None:
        self.calls, self.bytes, self.error_sq, self.norm_sq = 0, 0, 0.0, 0.0
        self.by_dtype = {}


class Wire:
    """A process group, how its all_reduces travel (``transport``) and who counts them (``traffic``)."""

    __slots__ = ("group", "transport", "traffic", "link")

    def __init__(self, group: dist.ProcessGroup | None = None, transport: Transport | None = None,
                 traffic: Traffic | None = None, link=None):
        self.group = resolve_group(group)
        self.transport = transport
        self.traffic = traffic
        self.link = link

    @staticmethod
    def of(state) -> "Wire":
        """The wire a hook's state stands for: a ``Wire`` as it is, a group (or ``None``) as a plain wire."""
        return state if isinstance(state, Wire) else Wire(state)

    def size(self) -> int:
        return self.group.size()

    def all_reduce(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start summing ``tensor`` in place across the group; a Future of ``tensor`` once summed.

        With torch's transport the call returns at once and the sum runs on the
        backend's own threads (that is what lets communication overlap the rest
        of backward). A point-to-point transport runs here and now and hands back
        a completed Future. With a link, the Future completes once the link
        has carried the message too.
        """
        if self.traffic is not None:
            self.traffic.record(tensor)
        if self.transport is None:
            def summed(done: torch.futures.Future) -> torch.Tensor:
                done.value()          # raises here if the collective failed
                return tensor         # summed in place (a complex tensor travels as its real view)
            fut = dist.all_reduce(tensor, group=self.group, async_op=True).get_future().then(summed)
        else:
            self.transport(tensor, self.group)
            fut = torch.futures.Future()
            fut.set_result(tensor)
        return fut if self.link is None else self.link.carry(fut, tensor, self.size())

    def __repr__(self) -> str:
        transport = getattr(self.transport, "__name__", "torch")
        link = "" if self.link is None else f", link={self.link.spec.name}"
        return f"Wire(size={self.size()}, transport={transport}, metered={self.traffic is not None}{link})"
