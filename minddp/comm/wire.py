"""The wire: a process group as the comm hooks see it, with how its sums travel and who counts them.

A comm hook's state is, as in torch, a process group (``None`` = the default group), which the plain
hook sees as a :class:`~minddp.comm.plain.Group`. minddp also accepts a :class:`Wire` there: a ``Group``
plus, passed explicitly rather than set process-wide,

* a **transport**: ``None`` for torch's own collectives, or one written from point-to-point messages
  (:data:`minddp.collectives.TRANSPORTS`), to watch a ring all_reduce carry real gradients;
* a **meter** (:class:`Traffic`): calls and payload bytes of every collective sent through it
  (``numel * element_size`` of the whole tensor: what a ring moves per rank is a multiple of it);
* a **link** (:class:`~minddp.comm.link.Link`): an emulated network under the real collective.

Every minddp hook sends through ``Wire.of(state).all_reduce(tensor)`` (the plain hook through
``Group.of(state)``, which a ``Wire`` is), and the sharded stages through :meth:`Wire.reduce_scatter`
and :meth:`Wire.all_gather`, so any of them can be metered or rerouted. Those two are where the device
rule (which backend carries a tensor: ``minddp.runtime.device``) and torch's release differences
(``minddp.runtime.compat``) come in; the teaching stages' path, ``minddp/comm/plain.py``, needs neither.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import AsyncBucketDDP
    >>> from minddp.comm.default_hooks import allreduce_hook
    >>> traffic = Traffic()
    >>> model = AsyncBucketDDP(torch.nn.Linear(4, 2))
    >>> model.register_comm_hook(Wire(None, traffic=traffic), allreduce_hook)
    >>> model(torch.ones(3, 4)).sum().backward(); model.finish_gradient_synchronization()
    >>> traffic.calls, traffic.bytes                  # one bucket of 10 fp32 values
    (1, 40)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
import torch.distributed as dist

from minddp.comm.plain import Group, when_done
from minddp.runtime import compat, keep
from minddp.runtime.device import backends_by_device

#: ``transport(tensor, group)`` sums ``tensor`` in place across ``group`` and returns when done. A
#: transport that also has ``reduce_scatter(output, input, group)`` and ``all_gather(output, input, group)``
#: (:class:`minddp.collectives.Transport`) carries the sharded stages' collectives too.
Transport = Callable[[torch.Tensor, dist.ProcessGroup], None]


@dataclass
class Traffic:
    """What went over one wire since the last :meth:`reset`: collective calls and payload bytes.

    ``by_op`` splits them by collective: ``{"all_reduce": [calls, bytes], ...}``.

    ``error_sq``/``norm_sq`` accumulate ||g - ĝ||² and ||g||² when a hook is
    wrapped in :func:`minddp.comm.measure.error_measured` (an extra exact
    all_reduce per bucket, which is *not* counted here), and ``magnitude_sq``,
    ``magnitude_sum``, ``values`` what :func:`minddp.comm.measure.rounding_bound`
    needs of the ranks' mean magnitudes ``a_i``: Σ a_i², Σ a_i and their number.

    Those are added by :meth:`measured`, from the callbacks of the backend's threads: two buckets' at once
    when two collectives end together; so each sum is read and written back under one lock.
    """

    calls: int = 0
    bytes: int = 0
    by_dtype: dict = field(default_factory=dict)
    by_op: dict = field(default_factory=dict)
    error_sq: float = 0.0
    norm_sq: float = 0.0
    magnitude_sq: float = 0.0
    magnitude_sum: float = 0.0
    values: int = 0
    _adding: ClassVar[threading.Lock] = threading.Lock()  # one for every meter: they are added to rarely

    def measured(self, error_sq: float, norm_sq: float, magnitude_sq: float, magnitude_sum: float, values: int) -> None:
        """Add one bucket's measurement (:func:`~minddp.comm.measure.error_measured`), as one step: a
        ``+=`` from two threads could read the same old sum and write back one bucket's only."""
        with self._adding:
            self.error_sq += error_sq
            self.norm_sq += norm_sq
            self.magnitude_sq += magnitude_sq
            self.magnitude_sum += magnitude_sum
            self.values += values

    def record(self, tensor: torch.Tensor, op: str = "all_reduce") -> None:
        nbytes = tensor.numel() * tensor.element_size()
        self.calls += 1
        self.bytes += nbytes
        self.by_dtype[tensor.dtype] = self.by_dtype.get(tensor.dtype, 0) + nbytes
        calls, total = self.by_op.get(op, (0, 0))
        self.by_op[op] = (calls + 1, total + nbytes)

    def relative_error(self) -> float | None:
        """||g - ĝ|| / ||g|| over everything measured since the reset (None if nothing was)."""
        return (self.error_sq / self.norm_sq) ** 0.5 if self.norm_sq > 0 else None

    def snapshot(self) -> dict:
        by_dtype = {str(dtype).replace("torch.", ""): n for dtype, n in self.by_dtype.items()}
        return {
            "calls": self.calls,
            "bytes": self.bytes,
            "by_dtype": by_dtype,
            "by_op": {op: list(v) for op, v in self.by_op.items()},
            "relative_error": self.relative_error(),
            "norm": self.norm_sq**0.5,
            "magnitudes": {
                "magnitude_sq": self.magnitude_sq,
                "magnitude_sum": self.magnitude_sum,
                "values": self.values,
            },
        }

    def reset(self) -> None:
        self.calls, self.bytes, self.error_sq, self.norm_sq = 0, 0, 0.0, 0.0
        self.magnitude_sq, self.magnitude_sum, self.values = 0.0, 0.0, 0
        self.by_dtype, self.by_op = {}, {}


class Wire(Group):
    """A process group, how its collectives travel (``transport``) and who counts them (``traffic``)."""

    __slots__ = ("transport", "traffic", "link")

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        transport: Transport | None = None,
        traffic: Traffic | None = None,
        link=None,
    ):
        super().__init__(group)
        self.transport = transport
        self.traffic = traffic
        self.link = link

    # of(state) and size() come from Group: ``Wire.of(state)`` is ``state`` if it is a Wire, else ``Wire(state)``

    def all_reduce(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start summing ``tensor`` in place across the group; a Future of ``tensor`` once summed.

        With torch's transport the call returns at once and the sum runs on the
        backend's own threads (:meth:`Group.all_reduce`). A point-to-point
        transport runs here and now and hands back a completed Future. With a
        link, the Future completes once the link has carried the message too.
        """
        if self.traffic is not None:
            self.traffic.record(tensor)
        if self.transport is None:  # summed in place (a complex tensor travels as its real view)
            fut = super().all_reduce(*keep.held(tensor))  # kept until gloo lets go (a hook's copy may be dropped)
        else:
            self.transport(tensor, self.group)
            fut = _done(tensor)
        return self._carried(fut, tensor, "all_reduce")

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> torch.futures.Future:
        """Start ``output`` = this rank's chunk of the sum of ``input`` over the group; a Future of ``output``.

        ``input`` holds one chunk per rank, back to back (rank 0's first), each
        the size of ``output``; it may be used as scratch space. Asynchronous
        with torch's transport, as :meth:`all_reduce`.

        On gloo, torch's transport sums the whole ``input`` with all_reduce and
        keeps this rank's chunk: gloo's own reduce_scatter hands back no Future
        (which a comm hook must hand back, so nothing could be chained to it) and
        is slower than its all_reduce of the same tensor (``docs/sharding.md``
        has the measurements). The result is the same; the bytes are all_reduce's.
        """
        if self.traffic is not None:
            self.traffic.record(input, "reduce_scatter")
        if self.transport is None and backends_by_device(self.group).get(input.device.type) == "gloo":
            mine = input.view(-1).chunk(self.size())[self.group.rank()]

            def keep_mine(done: torch.futures.Future) -> torch.Tensor:
                done.value()  # raises here if the sum failed
                output.view(-1).copy_(mine)
                return output

            keep.held(input)
            fut = keep.then(dist.all_reduce(input, group=self.group, async_op=True).get_future(), keep_mine)
        elif self.transport is None:
            keep.held(output, input)
            fut = when_done(compat.reduce_scatter_single(output, input, group=self.group, async_op=True), output)
        else:
            self.transport.reduce_scatter(output, input, self.group)
            fut = _done(output)
        return self._carried(fut, input, "reduce_scatter")  # the link prices a reduce-scatter, whatever ran

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> torch.futures.Future:
        """Start ``output`` = every rank's ``input``, back to back in rank order; a Future done when it is.

        Its value is ``[output]``, as the collective's own Future holds it: no
        Python callback is chained to it, so gloo's worker thread never waits
        for the GIL between the all-gathers a sharded stage starts at once.
        """
        if self.traffic is not None:
            self.traffic.record(output, "all_gather")
        if self.transport is None:
            keep.held(output, input)
            fut = compat.all_gather_single(output, input, group=self.group, async_op=True).get_future()
        else:
            self.transport.all_gather(output, input, self.group)
            fut = _done([output])
        return self._carried(fut, output, "all_gather")

    def _carried(self, fut: torch.futures.Future, payload: torch.Tensor, kind: str) -> torch.futures.Future:
        """``fut`` as it is, or with a link: completed once the link has carried ``payload`` too."""
        return fut if self.link is None else self.link.carry(fut, payload, self.size(), kind)

    def __repr__(self) -> str:
        transport = getattr(self.transport, "__name__", "torch")
        link = "" if self.link is None else f", link={self.link.spec.name}"
        return f"Wire(size={self.size()}, transport={transport}, metered={self.traffic is not None}{link})"


def _done(value) -> torch.futures.Future:
    """A Future that already holds ``value`` (what a point-to-point transport, done at once, hands back)."""
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(value)
    return done
