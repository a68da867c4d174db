"""Per-step numbers, the same on CPU and GPU: step time, collective calls and bytes, comm time.

Each path (:mod:`~minddp.analysis.cpu`, :mod:`~minddp.analysis.gpu`) reduces
a rank's trace to :class:`RankIntervals`; from there (every measure through its one
function in :mod:`~minddp.analysis.metrics`):

1. each ``ProfilerStep#N`` range is one step (its time is its duration);
2. an all_reduce *call* is one ``gloo:all_reduce`` (CPU) or ``nccl:all_reduce``
   (GPU) range, counted in the step it starts in; all_gather and
   reduce_scatter calls (the sharded stages') likewise, in their own columns;
3. its bytes are ``numel × element size`` of the first input, from the
   ``Input Dims``/``Input type`` that ``record_shapes=True`` stores;
4. comm time of a step is its communication in flight, ``|comm ∩ step|``;
5. over an emulated link, the link's modeled transfers and the training thread's waits for them
   (:func:`link_sets`), so that a step's *waited* and *exposed* time are known from its trace too.

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
from minddp.analysis.names import KINDS

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
    link: list[metrics.Interval] = field(default_factory=list)  # an emulated link's modeled transfers (step 5)
    waits: list[metrics.Interval] | None = None  # the training thread's waits for them; None: not seen (step 5)


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
    """Steps 1-4: for each profiled step, its time, calls and bytes of each kind, and comm time."""
    rows = []
    comm = metrics.merge(iv.comm)  # once, not once a step
    for number, start, end in iv.steps:
        row = {"step": number, "step_time_us": end - start}
        for kind in KINDS:
            calls = [e for e in getattr(iv, f"{kind.key}s") if start <= e["ts"] < end]
            row[f"{kind.key}_calls"] = len(calls)
            row[f"{kind.key}_bytes"] = sum(bytes_of(e) for e in calls)
        row["comm_time_us"] = metrics.in_flight(comm, [(start, end)])
        rows.append(row)
    return rows


def per_step_means(iv: RankIntervals) -> dict:
    rows = per_step(iv)
    n = len(rows)
    means = {"steps": n}
    for kind in KINDS:
        means[f"{kind.key}_calls_per_step"] = sum(r[f"{kind.key}_calls"] for r in rows) / n
        means[f"{kind.key}_bytes_per_step"] = sum(r[f"{kind.key}_bytes"] for r in rows) / n
    means["comm_time_per_step_us"] = sum(r["comm_time_us"] for r in rows) / n
    means["step_time_us"] = sum(r["step_time_us"] for r in rows) / n
    return means


#: The name prefix of an emulated link's transfers in a trace (:meth:`minddp.comm.link.Link.annotate_trace`).
LINK_PREFIX = "minddp.link:"


def link_sets(events: list[dict]) -> tuple[list[metrics.Interval], list[metrics.Interval] | None]:
    """Step 5: ``(link, waits)`` from the link's transfer events among ``events``: each transfer from its start to
    its modeled end, and each wait from the training thread's first ``wait()`` on it (``waited_ts``) to its
    delivery (the event's end). ``waits`` is None where no transfer records a wait: no link, or a stage that
    waits on a Future of its own chained to the link's (torch's C++ reducer), whose waits the link cannot see."""
    transfers = [e for e in events if e["name"].startswith(LINK_PREFIX)]
    link = [(e["ts"], e["args"]["modeled_end_ts"]) for e in transfers if "modeled_end_ts" in e.get("args", {})]
    seen = [(e["args"]["waited_ts"], end_of(e)) for e in transfers if "waited_ts" in e.get("args", {})]
    return link, (seen or None)


#: Where a step's non-compute time can fall (step 1 of :func:`step_anatomy`), as the columns and the words that
#: name them; inside backward it is the *interleaved* measure.
REGIONS = {
    "non_compute_forward_us": "in forward, before its ops had anything to compute beside it (parameters gathered)",
    "interleaved_us": "inside backward, while no op computed (interleaved: a hook waiting for its message, or Python)",
    "non_compute_between_us": "between micro-batches, after each backward (a sync per micro-batch)",
    "non_compute_tail_us": "after the last backward, waiting for the last messages before the optimizer",
    "non_compute_optimizer_us": "in and after the optimizer step (e.g. parameters all-gathered after it)",
}


def step_anatomy(iv, phases: list[dict]) -> list[dict]:
    """For every profiled step of one rank, the measures of :mod:`~minddp.analysis.metrics` (``phases``:
    :func:`~minddp.analysis.cpu.step_phases` rows of those steps, µs from each step's start; empty for a GPU trace):

    1. **non-compute** (``non_compute_us``), and where in the step it falls (:data:`REGIONS`; inside backward:
       **interleaved**);
    2. communication **in flight during backward** (``comm_in_backward_us``), and the **tail**: how long after
       backward's end the last message before the optimizer ended;
    3. **overlap** (``overlap_pctg``);
    4. over an emulated link whose waits the trace records, **waited** and **exposed** (``waited_us``,
       ``exposed_us``; NaN where the trace does not show the waits).
    """
    comm, compute = metrics.merge(iv.comm), metrics.merge(iv.compute)  # once, not once a step
    rows = []
    for number, s0, s1 in iv.steps:
        mine = [p for p in phases if p["step"] == number]

        def spans(phase, mine=mine, s0=s0):
            return metrics.merge((s0 + p["start_us"], s0 + p["end_us"]) for p in mine if p["phase"] == phase)

        step = [(s0, s1)]
        row = {
            "step": number,
            "non_compute_us": metrics.non_compute(step, compute, comm),  # step 1
            "overlap_pctg": metrics.overlap_pct(comm, compute, step),  # step 3
            "waited_us": float("nan") if iv.waits is None else metrics.waited(iv.waits, step),  # step 4
            "exposed_us": float("nan") if iv.waits is None else metrics.exposed(iv.link, iv.waits, step),
        }
        backward, forward, optimizer = spans("backward"), spans("forward"), spans("optimizer")
        if backward:
            end = backward[-1][1]
            opt_start = optimizer[0][0] if optimizer and optimizer[0][0] >= end else s1
            regions = {
                "non_compute_forward_us": forward,
                "non_compute_between_us": metrics.subtract([(s0, end)], metrics.merge(backward + forward)),
                "non_compute_tail_us": [(end, opt_start)],
                "non_compute_optimizer_us": [(opt_start, s1)],
            }
            row.update({k: metrics.non_compute(v, compute, comm) for k, v in regions.items()})
            row["interleaved_us"] = metrics.interleaved(comm, compute, backward)
            row["comm_in_backward_us"] = metrics.in_flight(comm, backward)  # step 2
            before_opt = [e for s, e in metrics.intersect(comm, step) if s < opt_start]
            row["tail_us"] = max(0.0, max(before_opt, default=end) - end)
        rows.append(row)
    return rows
