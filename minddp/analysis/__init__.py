"""Trace analysis and stage-vs-stage comparison, as pandas DataFrames.

The numbers the blog reads off HolisticTraceAnalysis (time breakdown, overlap, kind of work), for a
whole run on whatever hardware recorded it (docs/analysis.md says what each means):

1. **load** the run folder (:mod:`.events`), refusing broken or mixed traces with a :class:`TraceError`;
2. **route** each stage: GPU traces to HTA (:mod:`.gpu`), CPU/gloo traces to :mod:`.cpu`; both fill
   the same columns, with the same definitions (:mod:`.metrics`);
3. **tabulate**: per (stage, rank) :attr:`RunAnalysis.summary`, per stage :attr:`RunAnalysis.stages`,
   per-step numbers, the kernel-type breakdown, and for CPU traces one step's buckets and phases.

Example (on one rank; the trace of a tiny run)::

    >>> import os, tempfile
    >>> from minddp.runtime.profiling import tiny_run
    >>> run = tempfile.TemporaryDirectory()                     # a run folder: one stage, one rank
    >>> _ = tiny_run(run.name)                                  # 3 steps, 2 recorded: a matmul, two all_reduces
    >>> from minddp.analysis import analyze_run
    >>> result = analyze_run(run.name)
    >>> result.stages[["allreduce_calls_per_step", "allreduce_bytes_per_step"]]   # 64·64·4 + 10·4 bytes
           allreduce_calls_per_step  allreduce_bytes_per_step
    stage
    simple                      2.0                   16424.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from minddp.analysis import cpu, gpu, metrics
from minddp.analysis.events import Run, TraceError, gc_paused, load_run, read_trace
from minddp.analysis.names import KINDS, STAGE_ORDER, stage_sort_key
from minddp.analysis.steps import per_step, per_step_means, step_anatomy

#: The columns both paths fill, in display order.
SUMMARY_COLUMNS = [
    "run",
    "stage",
    "rank",
    "device",
    "source",
    "steps",
    "step_time_us",
    "total_time_us",
    "compute_time_us",
    "non_compute_time_us",
    "idle_time_us",
    "compute_pctg",
    "non_compute_pctg",
    "idle_pctg",
    "comm_comp_overlap_pctg",
    *(f"{kind.key}_{what}_per_step" for kind in KINDS for what in ("calls", "bytes")),
    "comm_time_per_step_us",
]
#: The per-stage comparison: means over ranks of these.
STAGE_COLUMNS = SUMMARY_COLUMNS[5:]


@dataclass
class RunAnalysis:
    """Every table of one run. ``stages`` is the side-by-side comparison."""

    run: str
    summary: pd.DataFrame  # one row per (stage, rank)
    stages: pd.DataFrame  # index: stage; mean over ranks
    per_step: pd.DataFrame  # one row per (stage, rank, step)
    kernels: pd.DataFrame  # kernel-type breakdown per stage
    buckets: pd.DataFrame  # per-bucket timeline of one step, per (stage, rank)
    phases: pd.DataFrame  # forward/backward/finish/optimizer spans of that step, per (stage, rank)
    configs: dict = field(default_factory=dict)  # stage -> its config.json (what the run was asked to do)


def analyze_run(path) -> RunAnalysis:
    """Steps 1-3 for the run folder ``path`` (``traces/<run>``, one stage folder of it, any folder of rank
    traces), or for a :class:`Run` loaded already."""
    with gc_paused():  # millions of event objects, no cycles: see events.gc_paused
        return _analyze_run(path)


def _analyze_run(path) -> RunAnalysis:
    run = path if isinstance(path, Run) else load_run(path)  # step 1
    summary, steps, kernels, buckets, phases = [], [], [], [], []
    for name in sorted(run.stages, key=stage_sort_key):
        stage = run.stages[name]
        on_gpu = any(gpu.is_gpu_trace(t) for t in stage.ranks.values())  # step 2
        every_step = {}  # rank -> the phases of every profiled step (CPU traces), for the verdict
        if on_gpu:
            rows, kernel_rows = gpu.analyze_stage(stage)
            intervals = {r: gpu.rank_intervals(t) for r, t in stage.ranks.items()}
        else:
            rows = [dict(cpu.rank_metrics(t), rank=r) for r, t in stage.ranks.items()]
            intervals = {r: cpu.rank_intervals(t) for r, t in stage.ranks.items()}
            kernel_rows = cpu.kernel_breakdown(stage.ranks[min(stage.ranks)])
            for r, t in stage.ranks.items():
                buckets += [dict(b, stage=name, rank=r) for b in cpu.bucket_timeline(t)]
                phases += [dict(p, stage=name, rank=r) for p in cpu.step_phases(t)]
                every_step[r] = [p for n, _, _ in intervals[r].steps for p in cpu.step_phases(t, n)]
        tag = {
            "run": run.name,
            "stage": name,
            "device": "gpu" if on_gpu else "cpu",
            "source": "hta" if on_gpu else "minddp",
        }
        summary += [dict(row, **tag) for row in rows]  # step 3
        for r, iv in intervals.items():
            anatomy = {a["step"]: a for a in step_anatomy(iv, every_step.get(r, []))}
            steps += [dict(s, **anatomy[s["step"]], stage=name, rank=r) for s in per_step(iv)]
        kernels += [dict(k, stage=name) for k in kernel_rows]
    summary_df = pd.DataFrame(summary, columns=SUMMARY_COLUMNS)
    stages_df = summary_df.groupby("stage", sort=False)[STAGE_COLUMNS].mean(numeric_only=True)
    return RunAnalysis(
        run.name,
        summary_df,
        stages_df,
        pd.DataFrame(steps),
        pd.DataFrame(kernels),
        pd.DataFrame(buckets),
        pd.DataFrame(phases),
        {name: stage.config for name, stage in run.stages.items()},
    )


def _intervals_of(trace_file, rank: int):
    """One rank's trace file as intervals, through the GPU or the CPU path (step 2)."""
    trace = read_trace(trace_file, rank)
    return (gpu if gpu.is_gpu_trace(trace) else cpu).rank_intervals(trace)


def overlap_parts(trace_file, rank: int) -> tuple[float, float]:
    """:func:`minddp.analysis.metrics.overlap_parts` of one rank's trace over its profiled steps, in µs:
    communication under compute, and all communication; ``100 * under / comm`` is ``comm_comp_overlap_pctg``.

    Two sums, so that several traces (ranks, rounds of a benchmark) pool into one honest ratio
    (:func:`~minddp.analysis.metrics.pooled_overlap_pct`) instead of an average of ratios.
    """
    iv = _intervals_of(trace_file, rank)
    return metrics.overlap_parts(iv.comm, iv.compute, [(s, e) for _, s, e in iv.steps])


def trace_traffic(trace_file, rank: int) -> tuple[float, float]:
    """``(all_reduce calls, payload bytes)`` per profiled step of one rank's trace.

    For code whose collectives no Python meter sees (torch's C++ reducer).
    """
    means = per_step_means(_intervals_of(trace_file, rank))
    return means["allreduce_calls_per_step"], means["allreduce_bytes_per_step"]


def compare_runs(a, b) -> pd.DataFrame:
    """Two runs side by side (e.g. allreduce vs PowerSGD): per stage, each metric of A and of B.

    Columns are a two-level index ``(metric, run name)``; ``a``/``b`` are run
    folders or :class:`RunAnalysis` results.
    """
    ra = a if isinstance(a, RunAnalysis) else analyze_run(a)
    rb = b if isinstance(b, RunAnalysis) else analyze_run(b)
    label_a, label_b = (ra.run, rb.run) if ra.run != rb.run else (f"A:{ra.run}", f"B:{rb.run}")
    both = pd.concat({label_a: ra.stages, label_b: rb.stages}, axis=1)
    both = both.swaplevel(axis=1)
    metrics_order = [c for c in STAGE_COLUMNS if c in ra.stages.columns]
    both = both.reindex(columns=pd.MultiIndex.from_product([metrics_order, [label_a, label_b]]))
    return both.reindex(sorted(both.index, key=stage_sort_key))


__all__ = [
    "analyze_run",
    "compare_runs",
    "overlap_parts",
    "trace_traffic",
    "RunAnalysis",
    "TraceError",
    "Run",
    "load_run",
    "SUMMARY_COLUMNS",
    "STAGE_COLUMNS",
    "STAGE_ORDER",
    "stage_sort_key",
]
