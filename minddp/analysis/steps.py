"""Per-step numbers, the same on CPU and GPU: step time, all_reduce calls and bytes, comm time.

Each path (:mod:`~minddp.analysis.cpu`, :mod:`~minddp.analysis.gpu`) reduces
a rank's trace to :class:`RankIntervals`; from there:

1. each ``ProfilerStep#N`` range is one step (its time is its duration);
2. an all_reduce *call* is one ``gloo:all_reduce`` (CPU) or ``nccl:all_reduce``
   (GPU) range, counted in the step it starts in;
3. its bytes are ``numel × element size`` of the first input, from the
   ``Input Dims``/``Input type`` that ``record_shapes=True`` stores;
4. comm time of a step is ``|comm ∩ step|`` (see :mod:`~minddp.analysis.metrics`).

Example::

    >>> per_step_means(rank_intervals(trace))["allreduce_calls_per_step"]
    6.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from minddp.analysis import metrics

_STEP = re.compile(r"^ProfilerStep#(\d+)$")

@dataclass
class RankIntervals:
    steps: list[tuple[int, float, float]]   # (step number, start, end)
    compute: list[metrics.Interval]
    comm: list[metrics.Interval]
    allreduces: list[dict]                   # the all_reduce events, by start time
    comm_threads: set = field(default_factory=set)


def end_of(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


#: Bytes per element, by the type names the profiler writes in ``Input type``.
ELEMENT_SIZE = {"float": 4, "float32": 4, "c10::Half": 2, "half": 2, "float16": 2, "c10::BFloat16": 2,
                "bfloat16": 2, "double": 8, "float64": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4,
                "signed char": 1, "unsigned char": 1, "bool": 1, "short int": 2}


def step_windows(events: list[dict], skip_tids=frozenset()) -> list[tuple[int, float, float]]:
    """Step 1: ``(N, start, end)`` of each ``ProfilerStep#N``; without any, the whole span is one step."""
    steps = sorted((int(m.group(1)), e["ts"], end_of(e)) for e in events
                   if e.get("tid") not in skip_tids and (m := _STEP.match(e["name"])))
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
    for number, start, end in iv.steps:
        calls = [e for e in iv.allreduces if start <= e["ts"] < end]
        rows.append({
            "step": number,
            "step_time_us": end - start,
            "allreduce_calls": len(calls),
            "allreduce_bytes": sum(bytes_of(e) for e in calls),
            "comm_time_us": metrics.length(metrics.intersect(iv.comm, [(start, end)])),
        })
    return rows


def per_step_means(iv: RankIntervals) -> dict:
    rows = per_step(iv)
    n = len(rows)
    return {
        "steps": n,
        "allreduce_calls_per_step": sum(r["allreduce_calls"] for r in rows) / n,
        "allreduce_bytes_per_step": sum(r["allreduce_bytes"] for r in rows) / n,
        "comm_time_per_step_us": sum(r["comm_time_us"] for r in rows) / n,
        "step_time_us": sum(r["step_time_us"] for r in rows) / n,
    }


