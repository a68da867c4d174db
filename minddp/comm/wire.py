"""The wire: the one door through which every hook's collective leaves this process.

Hooks never call ``torch.distributed`` directly; they call :func:`all_reduce`
here. Passing through one door buys two things:

* **a traffic meter** (:data:`traffic`): calls and payload bytes of every
  all_reduce, so "bytes on the wire" is measured, not estimated. Counting is
  two integer additions per call, so it is always on.
* **a choice of transport**: torch's built-in all_reduce (gloo/NCCL), or one
  of minddp's readable collectives written from point-to-point messages
  (:mod:`minddp.collectives`), chosen with :func:`use_transport`.

The meter and the transport belong to the process, like the profiler does:
one process is one rank, and every collective it issues is on the same wire.

Bytes are *payload* bytes (``numel * element_size`` of the tensor handed to
all_reduce); what the algorithm moves per rank depends on it (a ring moves
``2 (n-1)/n`` times the payload, see :mod:`minddp.collectives.ring`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

Transport = Callable[[torch.Tensor, dist.ProcessGroup], None]


def resolve_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``None`` means the default (world) group; the one place that says so.

    A group handed in is returned as it is: it exists, so torch.distributed
    was initialised (and this runs once per bucket launch, mid-backward).
    """
    if group is not None:
        return group
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: start ranks with minddp.launch.launch(...) "
            "or torchrun, or call torch.distributed.init_process_group first"
        )
    return dist.group.WORLD


def src_rank(group: dist.ProcessGroup) -> int:
    """Global rank of the group's rank 0: the source of every broadcast."""
    return dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0


@dataclass
class Traffic:
    """Counts of what this process put on the wire since the last :meth:`reset`.

    ``error_sq``/``norm_sq`` accumulate ||g - ĝ||² and ||g||² when a stage is
    asked to measure compression error (off by default: it costs an extra
    exact all_reduce per bucket, which is *not* counted here).
    """

    calls: int = 0
    bytes: int = 0
    by_dtype: dict = field(default_factory=dict)
    error_sq: float = 0.0
    norm_sq: float = 0.0

    def record(self, tensor: torch.Tensor) -> None:
        self.calls += 1
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes += nbytes
        self.by_dtype[tensor.dtype] = self.by_dtype.get(tensor.dtype, 0) + nbytes   # named in snapshot()

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


#: The meter of this process (one process = one rank).
traffic = Traffic()

_transport: Transport | None = None  # None: torch's own all_reduce (asynchronous)


def use_transport(transport: Transport | None) -> None:
    """Route every hook all_reduce through ``transport(tensor, group)`` (None: torch's)."""
    global _transport
    _transport = transport


@contextlib.contextmanager
def transport(t: Transport | None):
    """``with transport(ring_all_reduce): ...`` for a block of code."""
    old = _transport
    use_transport(t)
    try:
        yield
    finally:
        use_transport(old)


def _sum_options() -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.asyncOp = True          # the caller waits on the Future (on GPUs: NCCL's own stream, not ours)
    return opts


_SUM = _sum_options()


def _sum_on_group(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.futures.Future:
    """Hand ``tensor`` to the process group's all_reduce (sum), as torch's C++ reducer does; its Future.

    ``torch.distributed.all_reduce(tensor, group=group, async_op=True)`` does the
    same after checking its arguments, building fresh options and looking for a
    coalescing context on every call; in the middle of backward, with the
    caches cold, those checks cost about 15 µs a call (measured on this project's
    2-core machine). The arguments are ours and known good, so go straight to the
    group.

    A complex tensor travels as its real view (the sum of the real and of the
    imaginary parts), as there; the collective's Future then holds that view,
    so on this rare path a Python callback hands back ``[tensor]`` itself,
    reading ``done.value()`` first so that a failed collective fails it too.
    """
    if not tensor.is_complex():
        return group.allreduce([tensor], _SUM).get_future()

    def as_sent(done: torch.futures.Future) -> list[torch.Tensor]:
        done.value()
        return [tensor]
    return group.allreduce([torch.view_as_real(tensor)], _SUM).get_future().then(as_sent)


def start_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.futures.Future:
    """Sum ``tensor`` in place across the group; return the collective's own Future (value ``[tensor]``).

    With torch's transport the call returns at once and the reduction runs on
    the backend's own threads/streams, which is what lets communication
    overlap with the rest of backward. A point-to-point transport runs here and
    now (readable, not overlapped) and hands back a completed future.

    Nothing in Python runs when the collective completes (but for complex
    tensors, see :func:`_sum_on_group`). That matters: a
    Python callback (``fut.then(...)``) runs on gloo's worker thread, which
    must take the GIL first, and while it waits it starts no other collective.
    """
    group = resolve_group(group)
    traffic.record(tensor)
    if _transport is None:
        return _sum_on_group(tensor, group)
    _transport(tensor, group)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result([tensor])
    return fut


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.futures.Future:
    """:func:`start_all_reduce`, with the Future's value unwrapped to ``tensor`` (what torch's hooks return).

    The unwrapping is a Python callback on the comm thread (see
    :func:`start_all_reduce`); hooks that only hand the result back to the
    stage can skip it.
    """
    return start_all_reduce(tensor, group).then(lambda fut: fut.value()[0])
