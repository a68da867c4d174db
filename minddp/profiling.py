"""Profiler traces per rank and per stage, laid out for comparison.

Layout (what ``python -m minddp.analyze traces/<run>`` reads)::

    traces/<run-name>/
        <stage>/config.json              the run's settings (written by rank 0)
        <stage>/rank0.pt.trace.json      one Chrome/Perfetto trace per rank
        <stage>/rank1.pt.trace.json
        summary.json                     losses, accuracy, timings of every stage

How a trace is taken (the blog's recipe):

1. profile the CPU, and CUDA when the rank computes on a GPU; record shapes
   and memory;
2. schedule: one warm-up step (the profiler runs but discards it, so the
   first step's one-off costs stay out), then ``active`` recorded steps; any
   later steps run unprofiled;
3. the training loop calls :meth:`StepProfiler.step` after every step; when
   the active steps are done, the trace is exported to
   ``rank<r>.pt.trace.json`` (``.gz`` if asked).

Example::

    >>> with StepProfiler("traces/run/bucket-async", rank=0, total_steps=20) as prof:
    ...     for step in range(20):
    ...         train_one_step()
    ...         prof.step()
"""

from __future__ import annotations

import json
import os

from torch.profiler import ProfilerActivity, profile, schedule


def quiet_kineto() -> None:
    """Silence kineto's own log unless the user set ``KINETO_LOG_LEVEL``.

    torch 2.13's profiler backend prints ``USDT: ... profiler_start`` and
    ``profiler_stop`` lines for every session, on every rank: hundreds of
    lines in a benchmark that profiles each configuration in each round. The
    trace itself is unaffected; set ``KINETO_LOG_LEVEL`` to see the log again.
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def trace_path(folder: str, rank: int, gzip: bool = False) -> str:
    return os.path.join(folder, f"rank{rank}.pt.trace.json" + (".gz" if gzip else ""))


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)


class StepProfiler:
    """A ``torch.profiler.profile`` on the blog's schedule, or a no-op when disabled."""

    def __init__(self, folder: str, rank: int, total_steps: int, active: int = 5, enabled: bool = True,
                 cuda: bool = False, gzip: bool = False, memory: bool = True):
        self.folder, self.rank, self.enabled = folder, rank, enabled
        self.path = trace_path(folder, rank, gzip)
        warmup = 1 if total_steps > 1 else 0          # a 1-step run has nothing to warm up with
        self.active = max(1, min(active, total_steps - warmup))
        quiet_kineto()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])      # step 1
        self._prof = profile(activities=activities,
                             schedule=schedule(wait=0, warmup=warmup, active=self.active, repeat=1),  # step 2
                             on_trace_ready=self._export, record_shapes=True, profile_memory=memory) \
            if enabled else None

    def _export(self, prof: profile) -> None:                                                 # step 3
        os.makedirs(self.folder, exist_ok=True)
        prof.export_chrome_trace(self.path)

    def __enter__(self) -> "StepProfiler":
        if self._prof is not None:
            self._prof.__enter__()
        return self

    def step(self) -> None:
        if self._prof is not None:
            self._prof.step()

    def __exit__(self, *exc) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)

