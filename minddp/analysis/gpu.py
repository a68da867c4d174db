"""GPU traces: HolisticTraceAnalysis's own numbers, in minddp's columns.

On a GPU trace the blog's three views come straight from HTA, so a user sees
the numbers HTA would give them:

1. **route**: a trace with GPU kernel events is a GPU trace (:func:`is_gpu_trace`);
   anything else goes to :mod:`minddp.analysis.cpu` (HTA raises on it);
2. **HTA**: ``TraceAnalysis`` gets the stage's rank files by rank, as
   :mod:`minddp.analysis.events` found them (HTA would otherwise read every
   file of the folder, ``config.json`` too, and take a trace without
   ``distributedInfo`` for rank 0);
3. **rename**: ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` are
   renamed to the columns the CPU path fills (same definitions, see
   :mod:`minddp.analysis.metrics`); ``get_gpu_kernel_breakdown`` is kept;
4. **per step**: HTA has no per-step comm counts, so those come from the
   trace itself, as on CPU: ``nccl:all_reduce`` ranges (with their input
   sizes) per ``ProfilerStep``, comm time = NCCL kernels inside the step.

Example::

    >>> from minddp.analysis.events import RankTrace
    >>> kernel = {"name": "ncclKernel_AllReduce", "cat": "kernel", "ph": "X", "ts": 0, "dur": 5, "tid": 7}
    >>> is_gpu_trace(RankTrace(0, "rank0.pt.trace.json", [kernel]))
    True
    >>> rows, kernels = analyze_stage(stage)  # a StageTraces of GPU traces: none in the repo  # doctest: +SKIP
    >>> rows[0]["comm_comp_overlap_pctg"]     # HTA's get_comm_comp_overlap  # doctest: +SKIP
    11.81
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import warnings

from minddp.analysis.events import RankTrace, StageTraces, TraceError
from minddp.analysis.steps import RankIntervals, end_of, link_sets, per_step_means, step_windows

_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

#: HTA column -> minddp column (see metrics.breakdown for the CPU side).
HTA_COLUMNS = {
    "kernel_time(us)": "total_time_us",
    "compute_time(us)": "compute_time_us",
    "non_compute_time(us)": "non_compute_time_us",
    "idle_time(us)": "idle_time_us",
    "compute_time_pctg": "compute_pctg",
    "non_compute_time_pctg": "non_compute_pctg",
    "idle_time_pctg": "idle_pctg",
    "comp_comm_overlap_pctg": "comm_comp_overlap_pctg",
}


#: Host-side communication in a GPU trace: gloo carrying CUDA tensors (ranks sharing a GPU), the emulated link.
HOST_COMM_PREFIXES = ("gloo:", "minddp.link:")


def is_gpu_trace(trace: RankTrace) -> bool:
    """Step 1: GPU traces hold kernel (or GPU memcpy/memset) events; CPU traces never do."""
    return any(e.get("cat") in _KERNEL_CATS for e in trace.events)


def _is_comm_kernel(e: dict) -> bool:
    return e.get("cat") == "kernel" and "nccl" in e["name"].lower()


def rank_intervals(trace: RankTrace) -> RankIntervals:
    """Step 4's inputs: steps (CPU ranges), compute kernels, communication, and the collective calls.

    Communication is the NCCL kernels, and, for ranks that share a GPU over gloo (``docs/devices.md``),
    gloo's own ranges on the host (and an emulated link's): those ranks' messages travel through host
    memory, where no kernel shows them.
    """
    kernels = [e for e in trace.events if e.get("cat") == "kernel"]
    cpu_events = [e for e in trace.events if e.get("cat") not in _KERNEL_CATS]
    comm = [(e["ts"], end_of(e)) for e in kernels if _is_comm_kernel(e)] + [
        (e["ts"], end_of(e)) for e in cpu_events if e["name"].startswith(HOST_COMM_PREFIXES)
    ]
    compute = [(e["ts"], end_of(e)) for e in kernels if not _is_comm_kernel(e)]

    def named(*parts: str) -> list[dict]:
        return sorted(
            (e for e in cpu_events if e["name"].startswith(("nccl:", "gloo:")) and any(p in e["name"] for p in parts)),
            key=lambda e: e["ts"],
        )

    link, waits = link_sets(cpu_events)
    return RankIntervals(
        step_windows(cpu_events),
        compute,
        comm,
        named("all_reduce"),
        set(),
        named("all_gather", "allgather"),
        named("reduce_scatter"),
        link,
        waits,
    )


@contextlib.contextmanager
def _quiet():
    """HTA's progress prints and its pandas deprecation warnings are not the user's business.

    HTA parses ranks in child processes, which print straight to the standard output's file: that is
    pointed at ``/dev/null`` while HTA runs (and Python's ``sys.stdout`` with it); its logger, which
    reports each file parsed as a warning, says only errors meanwhile.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    hta_log = logging.getLogger("hta")
    level = hta_log.level
    hta_log.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", RuntimeWarning)  # its 0 / 0 overlap where no NCCL kernel ran: NaN, as meant
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        hta_log.setLevel(level)


def hta_analysis(trace_files: dict[int, str]):
    """HTA's ``TraceAnalysis`` on ``{rank: trace file}``, its progress chatter kept off the user's terminal."""
    try:
        from hta.trace_analysis import TraceAnalysis  # imported here: HTA is slow to import
    except ImportError as exc:
        raise TraceError(
            f"GPU traces are read through HolisticTraceAnalysis, which cannot be imported here ({exc}): "
            "pip install holistictraceanalysis (without internet: docs/devices.md, the wheels to carry)"
        ) from None
    with _quiet():
        return TraceAnalysis(trace_files=dict(trace_files))


class HTAViewFailed(UserWarning):
    """One of HTA's views raised on a stage's traces: its columns are left empty (NaN), the rest stands."""


class HTAViewReadAgain(UserWarning):
    """HTA's temporal breakdown raised because its nanosecond rounding broke some kernels; it was read again
    with that rounding off (HTA's own switch, :data:`NS_ROUNDING_OFF`), and those are the numbers shown."""


#: HTA's own switch (``hta.configs.env_options``) that keeps a trace's nanosecond times as they are.
NS_ROUNDING_OFF = "HTA_DISABLE_NS_ROUNDING"


def rounded_negative(trace: RankTrace) -> list[dict]:
    """The GPU events HTA's nanosecond rounding leaves with a negative duration.

    HTA (0.5.0) rounds every start up and every end down to a whole microsecond when a trace's times have
    fractions, so an event shorter than 1 us that crosses no whole microsecond ends before it starts: a
    short kernel on a fast GPU (the tiny model's on an H200) is enough to make its temporal breakdown's
    own check (non-compute time >= 0) fail.
    """
    return [
        e
        for e in trace.events
        if e.get("cat") in _KERNEL_CATS
        and e.get("dur", -1) >= 0
        and math.ceil(e["ts"]) > math.floor(e["ts"] + e["dur"])
    ]


def _odd_gpu_events(stage: StageTraces) -> str:
    """What in the traces can break HTA's interval arithmetic: GPU events of negative or missing duration,
    as recorded or after HTA's rounding (:func:`rounded_negative`)."""
    odd = []
    for rank, trace in sorted(stage.ranks.items()):
        bad = [e for e in trace.events if e.get("cat") in _KERNEL_CATS and not (e.get("dur", -1) >= 0)]
        if bad:
            odd.append(
                f"rank {rank}: {len(bad)} GPU event(s) of negative or missing duration (first: {bad[0]['name']!r})"
            )
        rounded = rounded_negative(trace)
        if rounded:
            odd.append(
                f"rank {rank}: {len(rounded)} GPU event(s) under 1 us that HTA's rounding (start up, end down to "
                f"whole us) gives a negative duration (first: {rounded[0]['name']!r})"
            )
    return "; ".join(odd) or "no GPU event of negative or missing duration, as recorded or as HTA rounds it"


def _attempt(call):
    """``(call(), None)``, or ``(None, the exception)`` if HTA raised (its own assertions, pandas errors)."""
    try:
        with _quiet():
            return call(), None
    except Exception as exc:  # noqa: BLE001 - one view lost, not the others
        return None, exc


def _hta_version() -> str:
    try:
        from importlib.metadata import version

        return version("HolisticTraceAnalysis")
    except Exception:  # noqa: BLE001 - only for the message
        return "?"


def _failed(name: str, stage: StageTraces, exc: Exception) -> str:
    where = exc.__traceback__
    while where.tb_next is not None:
        where = where.tb_next
    frame = f"{where.tb_frame.f_code.co_name}, line {where.tb_lineno}"
    return (
        f"HTA {_hta_version()}'s {name} failed on stage {stage.name!r} ({type(exc).__name__} in {frame}: "
        f"{str(exc) or 'its own assertion'})"
    )


def _view(name: str, stage: StageTraces, call):
    """HTA's view ``name``, or None (with an :class:`HTAViewFailed` warning naming HTA's error) if it raised."""
    result, exc = _attempt(call)
    if exc is not None:
        _warn_failed(name, stage, exc)
    return result


def _warn_failed(name: str, stage: StageTraces, exc: Exception) -> None:
    warnings.warn(
        f"{_failed(name, stage, exc)}; its columns are left empty. In these traces: {_odd_gpu_events(stage)}",
        HTAViewFailed,
        stacklevel=4,
    )


def _temporal(stage: StageTraces, analysis, files: dict[int, str]):
    """HTA's temporal breakdown; if it raised where its rounding broke kernels (:func:`rounded_negative`),
    HTA's again on the traces read with that rounding off (an :class:`HTAViewReadAgain` says so)."""
    name = "get_temporal_breakdown"
    result, exc = _attempt(lambda: analysis.get_temporal_breakdown(visualize=False))
    if exc is None:
        return result
    if any(rounded_negative(t) for t in stage.ranks.values()):
        saved = os.environ.get(NS_ROUNDING_OFF)
        os.environ[NS_ROUNDING_OFF] = "1"  # read when HTA parses: its parsing processes inherit it
        try:
            result, again = _attempt(lambda: hta_analysis(files).get_temporal_breakdown(visualize=False))
        finally:
            if saved is None:
                del os.environ[NS_ROUNDING_OFF]
            else:
                os.environ[NS_ROUNDING_OFF] = saved
        if again is None:
            warnings.warn(
                f"{_failed(name, stage, exc)}: {_odd_gpu_events(stage)}; read again with {NS_ROUNDING_OFF}=1 "
                "(HTA's own switch: times kept to the nanosecond), whose numbers these are",
                HTAViewReadAgain,
                stacklevel=3,
            )
            return result
    _warn_failed(name, stage, exc)
    return None


def analyze_stage(stage: StageTraces) -> tuple[list[dict], list[dict]]:
    """Steps 2-4 for one stage: summary rows (one per rank) and kernel-breakdown rows.

    A view HTA fails on leaves its columns empty (NaN) and says why in an :class:`HTAViewFailed` warning;
    the other views and minddp's per-step numbers still come. A temporal breakdown HTA's own rounding broke
    is read again without it (:class:`HTAViewReadAgain`).
    """
    files = {rank: str(t.path.resolve()) for rank, t in stage.ranks.items()}
    analysis = hta_analysis(files)
    temporal = _temporal(stage, analysis, files)
    overlap = _view("get_comm_comp_overlap", stage, lambda: analysis.get_comm_comp_overlap(visualize=False))
    kernel_types = _view("get_gpu_kernel_breakdown", stage, lambda: analysis.get_gpu_kernel_breakdown(visualize=False))
    by_rank = {rank: {} for rank in stage.ranks}  # step 3
    for frame in (temporal, overlap):  # each fills the columns it has
        for record in [] if frame is None else frame.to_dict("records"):
            mine = {HTA_COLUMNS[theirs]: float(value) for theirs, value in record.items() if theirs in HTA_COLUMNS}
            by_rank[int(record["rank"])].update(mine)
    rows = []
    for rank in sorted(by_rank):
        row = {mine: by_rank[rank].get(mine, math.nan) for mine in HTA_COLUMNS.values()}
        row["rank"] = rank
        row.update(per_step_means(rank_intervals(stage.ranks[rank])))  # step 4
        rows.append(row)
    kernels = [
        {"kernel_type": r["kernel_type"], "sum": float(r["sum"]), "percentage": float(r["percentage"])}
        for r in ([] if kernel_types is None else kernel_types[0].to_dict("records"))
    ]
    return rows, kernels
