"""Collectives counted from a profiler still in memory: calls started, and bytes the backend moved.

The trace analysis (:mod:`~minddp.analysis.cpu`) reads exported trace files.
A notebook that only wants "how many all_reduces did this step make, and how
many bytes" can ask the profiler object directly, for any stage and for
torch's DDP alike (torch's C++ reducer is invisible to minddp's traffic meter,
not to the profiler):

1. a **call** is a ``c10d::allreduce_`` op: the moment a rank hands a tensor
   to the process group (for an async op, the start, not the end);
2. its **bytes** are those of the backend's own range (``gloo:all_reduce`` on
   CPU, ``nccl:all_reduce`` on GPU), ``numel × element size`` from the shapes
   and dtypes ``record_shapes=True`` stores, as in :mod:`~minddp.analysis.steps`;
3. for one step of :func:`minddp.ladder.loop.train_step` (:func:`step_view`): a
   micro-batch is a ``minddp.forward_backward`` range, its **backward** the
   span from the first to the last ``autograd::engine::evaluate_function``
   inside it (a comm hook that blocks runs inside those nodes, so it makes
   the backward longer); a call started inside a backward overlaps it, or
   at least interleaves with it; the **tail** is the time from the end of the
   last backward to the start of the ``minddp.optimizer_step`` range: what the
   step spent finishing the sync after the gradients were computed;
4. the sharded stages' **all-gathers** are counted apart
   (``c10d::_allgather_base_`` calls, ``gloo:all_gather`` bytes of their
   input, what this rank sent): the parameters that travel back. On gloo
   their reduce-scatters are all_reduces (:meth:`minddp.comm.wire.Wire.reduce_scatter`),
   counted with the calls above.

Example::

    >>> with torch.profiler.profile(record_shapes=True) as prof:
    ...     train_step(model, optimizer, micro_batches, loss_fn)
    >>> collectives(prof)
    {'calls': 3, 'bytes': 19838976}
"""

from __future__ import annotations

import math

import torch

from minddp.runtime import compat
from minddp.analysis.steps import ELEMENT_SIZE

CALL = "c10d::allreduce_"
BACKEND_RANGES = ("gloo:all_reduce", "nccl:all_reduce")
GATHER_CALL = "c10d::_allgather_base_"
GATHER_RANGES = ("gloo:all_gather", "nccl:all_gather")


def profiler(record_shapes: bool = True) -> torch.profiler.profile:
    """A CPU profiler for counting (no memory, no stacks: as light as the profiler gets)."""
    from minddp.runtime.profiling import quiet_kineto
    quiet_kineto()
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=record_shapes)


def calls(prof) -> list:
    """Step 1: the ``c10d::allreduce_`` events, by start time."""
    return sorted((e for e in prof.events() if e.name == CALL), key=lambda e: e.time_range.start)


def backend_bytes(prof, ranges: tuple = BACKEND_RANGES) -> int:
    """Step 2: bytes of every all_reduce (or other ``ranges``) the backend ran."""
    total, dtypes = 0, compat.input_dtypes(prof)
    for e in prof.events():
        if e.name in ranges and e.input_shapes and e.input_shapes[0]:
            dtype = (dtypes.get(e.id) or ["float"])[0]
            total += math.prod(e.input_shapes[0]) * ELEMENT_SIZE.get(str(dtype), 4)
    return total


def collectives(prof) -> dict:
    """Steps 1-2: ``{"calls": ..., "bytes": ...}`` of everything the profiler saw."""
    return {"calls": len(calls(prof)), "bytes": backend_bytes(prof)}


def _ranges(prof, name: str) -> list[tuple[float, float]]:
    return sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.name == name)


def step_view(prof) -> dict:
    """Step 3 for one profiled ``train_step``: calls, bytes, calls during a backward, last backward, tail (ms)."""
    events = prof.events()
    backward_nodes = [e for e in events if e.name.startswith("autograd::engine::evaluate_function")]
    spans = []
    for start, end in _ranges(prof, "minddp.forward_backward"):
        inside = [e for e in backward_nodes if start <= e.time_range.start <= end]
        if inside:
            spans.append((min(e.time_range.start for e in inside), max(e.time_range.end for e in inside)))
    started = [c.time_range.start for c in calls(prof)]
    optimizer = _ranges(prof, "minddp.optimizer_step")
    last = spans[-1] if spans else (0.0, 0.0)
    return {
        "calls": len(started),
        "bytes": backend_bytes(prof),
        "calls_in_backward": sum(any(s <= t <= e for s, e in spans) for t in started),
        "backward_ms": [(e - s) / 1e3 for s, e in spans],
        "last_backward_ms": (last[1] - last[0]) / 1e3,
        "after_last_backward_ms": ((optimizer[-1][0] if optimizer else last[1]) - last[1]) / 1e3,
        "gathers": sum(1 for e in events if e.name == GATHER_CALL),                    # step 4
        "gather_bytes": backend_bytes(prof, GATHER_RANGES),
    }
