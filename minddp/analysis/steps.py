"""Per-step numbers, the same on CPU and GPU: step time, collective calls and bytes, comm time.

Each path (:mod:`~minddp.analysis.cpu`, :mod:`~minddp.analysis.gpu`) reduces
a rank's trace to :class:`RankIntervals`; from there:

1. each ``ProfilerStep#N`` range is one step (its time is its duration);
2. an all_reduce *call* is one ``gloo:all_reduce`` (CPU) or ``nccl:all_reduce``
   (GPU) range, counted in the step it starts in; all_gather and
   reduce_scatter calls (the sharded stages') likewise, in their own columns;
3. its bytes are ``numel × element size`` of the first input, from the
   ``Input Dims``/``Input type`` that ``record_shapes=True`` stores;
4. comm time of a step is ``|comm ∩ step|`` (see :mod:`~minddp.analysis.metrics`).

Example (on one rank; the trace of a tiny run)::

    >>> import os, tempfile
    >>> from minddp.runtime.profiling import tiny_run
    >>> run = tempfile.TemporaryDirectory()                     # a run folder: one stage, one rank
    >>> _ = tiny_run(run.name)                                  # 3 steps, 2 recorded: a matmul, two all_reduces
    >>> from minddp.analysis.cpu import rank_intervals
    >>> from minddp.analysis.events import load_run
    >>> means = per_step_means(rank_intervals(load_run(run.name).stages["simple"].ranks[0]))
    >>> means["steps"], means["allreduce_calls_per_step"], means["allreduce_bytes_per_step"]  # 64·64·4 + 10·4
    (2, 2.0, 16424.0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from minddp.analysis import metrics

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class RankIntervals:
    steps: list[tuple[int, float, float]]  # (step number, start, end)
    compute: list[metrics.Interval]
    comm: list[metrics.Interval]
    allreduces: list[dict]  # the all_reduce events, by start time
    comm_threads: set = field(default_factory=set)
    allgathers: list[dict] = field(default_factory=list)  # the all_gather events (sharded stages)
    reducescatters: list[dict] = field(default_factory=list)  # the reduce_scatter events


def end_of(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


#: Bytes per element, by the type names the profiler writes in ``Input type``.
ELEMENT_SIZE = {
    "float": 4,
    "float32": 4,
    "c10::Half": 2,
    "half": 2,
    "float16": 2,
    "c10::BFloat16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "long int": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "short int": 2,
}


def step_windows(events: list[dict], skip_tids=frozenset(), candidates=None) -> list[tuple[int, float, float]]:
    """Step 1: ``(N, start, end)`` of each ``ProfilerStep#N``; without any, the whole span is one step.

    ``candidates``: the events among ``events`` that may be steps (every ``ProfilerStep#`` range),
    when the caller has them at hand; then only the fallback reads all of ``events``.
    """
    steps = sorted(
        (int(m.group(1)), e["ts"], end_of(e))
        for e in (events if candidates is None else candidates)
        if e.get("tid") not in skip_tids and (m := _STEP.match(e["name"]))
    )
    if not steps:
        steps = [(0, min(e["ts"] for e in events), max(end_of(e) for e in events))]
    return steps


def numel_of(dims) -> int:
    """Elements in the first tensor of a (possibly nested) ``Input Dims`` entry."""
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    n = 1
    for d in dims or [0]:
        n *= int(d)
    return n


def bytes_of(e: dict) -> int:
    """Step 3: the bytes of a collective's first input (unknown types count 4 bytes an element)."""
    args = e.get("args", {})
    dims, types = args.get("Input Dims") or [[]], args.get("Input type") or [""]
    return numel_of(dims[0]) * ELEMENT_SIZE.get(str(types[0]), 4)


def per_step(iv: RankIntervals) -> list[dict]:
    """Steps 1-4: for each profiled step, its time, all_reduce calls and bytes, and comm time."""
    rows = []
    comm = metrics.merge(iv.comm)  # once, not once a step
    for number, start, end in iv.steps:
        row = {"step": number, "step_time_us": end - start}
        for kind, events in (
            ("allreduce", iv.allreduces),
            ("allgather", iv.allgathers),
            ("reducescatter", iv.reducescatters),
        ):
            calls = [e for e in events if start <= e["ts"] < end]
            row[f"{kind}_calls"] = len(calls)
            row[f"{kind}_bytes"] = sum(bytes_of(e) for e in calls)
        row["comm_time_us"] = metrics.length(metrics.intersect(comm, [(start, end)]))
        rows.append(row)
    return rows


def per_step_means(iv: RankIntervals) -> dict:
    rows = per_step(iv)
    n = len(rows)
    means = {"steps": n}
    for kind in ("allreduce", "allgather", "reducescatter"):
        means[f"{kind}_calls_per_step"] = sum(r[f"{kind}_calls"] for r in rows) / n
        means[f"{kind}_bytes_per_step"] = sum(r[f"{kind}_bytes"] for r in rows) / n
    means["comm_time_per_step_us"] = sum(r["comm_time_us"] for r in rows) / n
    means["step_time_us"] = sum(r["step_time_us"] for r in rows) / n
    return means
