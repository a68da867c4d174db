"""Collectives counted from a profiler still in memory: calls started, and bytes the backend moved.

The trace analysis (:mod:`~minddp.analysis.cpu`) reads exported trace files; a notebook that only
wants "how many all_reduces did this step make, and how many bytes" asks the profiler object, for
any stage and torch's DDP alike. docs/analysis.md, "Counting without a trace", gives each step in full:

1. a **call** is a ``c10d::allreduce_`` op (for an async op, its start);
2. its **bytes**, ``numel × element size`` of the backend's ``gloo:``/``nccl:all_reduce`` range;
3. for one step of :func:`minddp.ladder.loop.train_step` (:func:`step_view`): each micro-batch's
   **backward**, the calls started inside one, the **tail** before the optimizer step, and the time the
   teaching stages' once-a-step **check** of the parameters used held the training thread (``check_ms``),
   and the last backward's time in autograd's ``AccumulateGrad`` steps (``accumulate_ms``: adding each
   gradient into ``.grad``, and the post-accumulate-grad hooks that run there, a stage's grad hooks with
   whatever they do: the check, handing a message over, a wait);
4. the sharded stages' **all-gathers**, and the stages' small check gathers, counted apart;
5. the step as a **row** of :mod:`minddp.analysis.timeline`; over an emulated link with the training
   thread's **waits** and ``link_ms`` (*link time*), ``waited_ms`` (*waited*), ``exposed_ms`` (*exposed*),
   ``waits_in_backward``, each measure by its function in :mod:`minddp.analysis.metrics`.

Example (on one rank)::

    >>> import torch.distributed as dist
    >>> with profiler() as prof:                                # record_shapes=True: the bytes need them
    ...     dist.all_reduce(torch.ones(64, 64)); dist.all_reduce(torch.ones(10))
    >>> collectives(prof)                                       # 64·64·4 + 10·4 bytes
    {'calls': 2, 'bytes': 16424}
"""

from __future__ import annotations

import math

import torch

from minddp.analysis import metrics
from minddp.analysis.steps import ELEMENT_SIZE
from minddp.runtime import compat

CALL = "c10d::allreduce_"
BACKEND_RANGES = ("gloo:all_reduce", "nccl:all_reduce")
GATHER_CALL = "c10d::_allgather_base_"
GATHER_RANGES = ("gloo:all_gather", "nccl:all_gather")
#: ``dist.all_gather`` of a list (not a flat tensor): the stages' check that every rank used the same parameters
SMALL_GATHER_CALL = "c10d::allgather_"


def profiler(record_shapes: bool = True) -> torch.profiler.profile:
    """A CPU profiler for counting (no memory, no stacks: as light as the profiler gets)."""
    from minddp.runtime.profiling import quiet_kineto

    quiet_kineto()
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=record_shapes)


def calls(prof) -> list:
    """Step 1: the ``c10d::allreduce_`` events, by start time."""
    return sorted((e for e in compat.profiler_events(prof) if e.name == CALL), key=lambda e: e.time_range.start)


def backend_bytes(prof, ranges: tuple = BACKEND_RANGES) -> int:
    """Step 2: bytes of every all_reduce (or other ``ranges``) the backend ran."""
    total = 0
    for e in compat.profiler_events(prof):
        if e.name in ranges and e.input_shapes and e.input_shapes[0]:
            dtype = (e.input_dtypes or ["float"])[0]
            total += math.prod(e.input_shapes[0]) * ELEMENT_SIZE.get(str(dtype), 4)
    return total


def collectives(prof) -> dict:
    """Steps 1-2: ``{"calls": ..., "bytes": ...}`` of everything the profiler saw."""
    return {"calls": len(calls(prof)), "bytes": backend_bytes(prof)}


def _ranges(prof, name: str) -> list[tuple[float, float]]:
    return sorted((e.time_range.start, e.time_range.end) for e in compat.profiler_events(prof) if e.name == name)


def step_view(prof, link=None) -> dict:
    """Step 3 for one profiled ``train_step``: calls, bytes, calls during a backward, last backward, tail (ms);
    and ``row``, the step as :mod:`minddp.analysis.timeline` draws it (step 5, with ``link``)."""
    events = compat.profiler_events(prof)
    backward_nodes = [e for e in events if e.name.startswith("autograd::engine::evaluate_function")]
    spans, forwards = [], []
    for start, end in _ranges(prof, "minddp.forward_backward"):
        inside = [e for e in backward_nodes if start <= e.time_range.start <= end]
        if inside:
            spans.append((min(e.time_range.start for e in inside), max(e.time_range.end for e in inside)))
            forwards.append((start, spans[-1][0]))
    started = [c.time_range.start for c in calls(prof)]
    optimizer = _ranges(prof, "minddp.optimizer_step")
    last = spans[-1] if spans else (0.0, 0.0)
    view = {
        "calls": len(started),
        "bytes": backend_bytes(prof),
        "calls_in_backward": sum(any(s <= t <= e for s, e in spans) for t in started),
        "backward_ms": [(e - s) / 1e3 for s, e in spans],
        "last_backward_ms": (last[1] - last[0]) / 1e3,
        "after_last_backward_ms": ((optimizer[-1][0] if optimizer else last[1]) - last[1]) / 1e3,
        "gathers": sum(1 for e in events if e.name == GATHER_CALL),  # step 4
        "gather_bytes": backend_bytes(prof, GATHER_RANGES),
        "small_gathers": sum(1 for e in events if e.name == SMALL_GATHER_CALL),
        "check_ms": metrics.waited(_checks(events)) / 1e3,  # the thread stood still there for a message
        "accumulate_ms": sum(  # the grad hooks run inside these steps (step 3)
            e.time_range.end - e.time_range.start
            for e in backward_nodes
            if "AccumulateGrad" in e.name and last[0] <= e.time_range.start <= last[1]
        )
        / 1e3,
    }
    t0 = forwards[0][0] if forwards else 0.0  # step 5

    def ms(pairs):
        return [((s - t0) / 1e3, (e - t0) / 1e3) for s, e in pairs]

    gathers = [e.time_range.start for e in events if e.name == GATHER_CALL]
    row = {
        "forward": ms(forwards),
        "backward": ms(spans),
        "optimizer": ms(optimizer),
        "finish": ms(_ranges(prof, "minddp.finish_gradient_synchronization")),
        "sent": [(t - t0) / 1e3 for t in sorted(started + gathers)],
        "waits": [],
        "messages": ms(
            sorted((e.time_range.start, e.time_range.end) for e in events if e.name in BACKEND_RANGES + GATHER_RANGES)
        ),
        "end": ((optimizer[-1][1] if optimizer else last[1]) - t0) / 1e3,
    }
    # when the stage handed each kind over (its call's start), ms: what notebook 06's figure marks
    view["handed"] = {
        kind: sorted((t - t0) / 1e3 for t in ts) for kind, ts in (("calls", started), ("gathers", gathers))
    }
    view["gather_spans"] = ms(sorted((e.time_range.start, e.time_range.end) for e in events if e.name in GATHER_RANGES))
    view["check_spans"] = ms(_checks(events))  # the few-byte check's gathers, from the call to the gather's end
    if link is not None:
        view.update(_on_link(events, link, row, t0, spans))
    view["row"] = row
    return view


def _checks(events) -> list[tuple[float, float]]:
    """The stages' once-a-step check gathers (:data:`SMALL_GATHER_CALL`), each from its call to the end of the
    backend's gather it started: the training thread waits for it there, for the other rank too (µs)."""
    ranges = sorted((e.time_range.start, e.time_range.end) for e in events if e.name in GATHER_RANGES)
    out = []
    for e in events:
        if e.name == SMALL_GATHER_CALL:
            start = e.time_range.start
            ends = [end for _, end in ranges if end >= start]
            out.append((start, min(ends) if ends else e.time_range.end))
    return out


def _on_link(events, link, row: dict, t0: float, backwards: list) -> dict:
    """Step 5 on an emulated link: its transfers and the training thread's waits, on the profiler's clock.

    The link logs each message in ``perf_counter`` seconds; the
    ``minddp.link_send#<n>`` marker recorded when message ``n`` was handed over
    places it on the profiler's clock (the median offset, as
    :meth:`minddp.comm.link.Link.annotate_trace` does). A message is drawn from the
    start of its modeled transfer to its modeled end; a wait runs from the first
    ``wait()`` on a message (``Link.asked``) to its delivery. Whether a wait began inside a backward is read off
    its ``minddp.link_wait#<n>`` range instead, on the backward's own clock and thread.
    """
    import statistics

    markers = {
        int(e.name.rpartition("#")[2]): e.time_range.start for e in events if e.name.startswith("minddp.link_send#")
    }
    log = [m for m in link.log if m["seq"] in markers]
    row["link"] = link.spec.name
    if not log:
        return {"link_ms": 0.0, "waited_ms": 0.0, "exposed_ms": 0.0, "waits": 0, "waits_in_backward": 0}
    offset = statistics.median(markers[m["seq"]] - m["handed_over"] * 1e6 for m in log)

    def at(seconds):
        return (seconds * 1e6 + offset - t0) / 1e3

    row["messages"] = [(at(m["start"]), at(m["modeled_end"])) for m in log]
    row["sent"] = [at(m["handed_over"]) for m in log]
    waits = sorted((at(link.asked[m["seq"]]), at(m["delivered"])) for m in log if m["seq"] in link.asked)
    row["waits"] = [(s, e) for s, e in waits if e > s]
    # inside a backward: by the ``minddp.link_wait#<n>`` range each first wait() records on the training thread,
    # on the profiler's clock like the backward's nodes, so program order decides (a wait inside a grad hook
    # starts inside its node; one in finish or in an end-of-backward callback, after the last node's end)
    begun = {
        int(e.name.rpartition("#")[2]): e.time_range.start for e in events if e.name.startswith("minddp.link_wait#")
    }
    in_backward = [begun[m["seq"]] for m in log if m["seq"] in link.asked and m["seq"] in begun]
    return {
        "link_ms": 1e3 * metrics.link_time(link, [(m["kind"], m["bytes"], m["ranks"]) for m in log]),
        "waited_ms": metrics.waited(row["waits"]),
        "exposed_ms": metrics.exposed(row["messages"], row["waits"]),
        "waits": len(waits),
        "waits_in_backward": sum(any(s <= w < e for s, e in backwards) for w in in_backward),
    }
