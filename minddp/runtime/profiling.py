"""Profiler traces per rank and per stage, laid out for comparison.

A run's traces go to ``traces/<run-name>/<stage>/rank<r>.pt.trace.json`` (with the stage's
``config.json`` beside them and the run's ``summary.json`` above), where ``python -m minddp.analyze
traces/<run>`` reads them. :class:`StepProfiler` takes a rank's trace the blog's way:

1. profile the CPU (and CUDA on a GPU rank), with shapes and memory;
2. one warm-up step, then ``active`` recorded steps; later steps run unprofiled;
3. export the trace when the active steps are done, through a temporary file checked complete and
   then renamed: a full disk loses the trace, not the run (:attr:`StepProfiler.error` says why).

Each trace names its job (:func:`job_id`, under the key :data:`JOB`), so that the analysis can tell the traces
of one job from traces of another left in the same folder without comparing clocks.

``docs/analysis.md`` (*Where the traces come from*) shows the layout and each step in full.

Example::

    >>> import os, tempfile
    >>> folder = os.path.join(tempfile.mkdtemp(), "bucket-async")
    >>> with StepProfiler(folder, rank=0, total_steps=3, active=1) as prof:
    ...     for step in range(3):
    ...         _ = torch.ones(8, 8) @ torch.ones(8, 8)          # one training step
    ...         prof.step()
    >>> os.listdir(folder), prof.error
    (['rank0.pt.trace.json'], None)
"""

from __future__ import annotations

import json
import os
import shutil
from gzip import open as gzip_open

from torch.profiler import ProfilerActivity, profile, schedule

#: The trace's top-level key that names the job its rank belonged to (what :func:`job_id` returns).
JOB = "minddp_job"
#: The variable minddp's launchers set in every rank of one job to the same fresh id.
JOB_ENV = "MINDDP_JOB"


def job_id() -> str | None:
    """The id every rank of this job shares: minddp's launchers' (:data:`JOB_ENV`), else torchrun's run id
    (``TORCHELASTIC_RUN_ID``: fresh under ``--standalone``, ``--rdzv-id``'s value otherwise); None outside both."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    return os.environ.get(JOB_ENV) or (run if run and run != "none" else None)


def quiet_kineto() -> None:
    """Silence kineto's own log unless the user set ``KINETO_LOG_LEVEL``.

    torch 2.13's profiler backend prints ``USDT: ... profiler_start`` and
    ``profiler_stop`` lines for every session, on every rank: hundreds of
    lines in a benchmark that profiles each configuration in each round. The
    trace itself is unaffected; set ``KINETO_LOG_LEVEL`` to see the log again.
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


#: Whether this process has spent the allocator's first warning (hush_allocator_warning).
_hushed = False


def hush_allocator_warning() -> None:
    """Spend, silently, the one warning per process of torch's CPU allocator under memory profiling.

    A tensor allocated before a memory profile starts and freed during it makes the allocator print
    ``CPUAllocator.cpp: Memory block of unknown size was allocated before the profiling started`` on
    stderr: once per process (then every 1000th time), on every rank of every stage, through
    the progress bars. It says the trace lacks those frees, which the analysis never reads. So, once per
    process, such a free happens here, in a profile of nothing, while stderr points to ``/dev/null``: the
    allocator's count is then past its first warning. Any other stderr output in those microseconds is lost.
    """
    global _hushed
    if _hushed:
        return
    _hushed = True
    import sys

    import torch

    early = torch.ones(256)  # allocated before the profile starts ...
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            del early  # ... freed inside it: the warning, into /dev/null
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def trace_path(folder: str, rank: int, gzip: bool = False) -> str:
    return os.path.join(folder, f"rank{rank}.pt.trace.json" + (".gz" if gzip else ""))


def write_json(path: str, payload: dict) -> None:
    """Write ``payload`` as JSON, atomically: the file is complete, or not there (and no partial file is left)."""
    write_text(path, json.dumps(payload, indent=2, default=str))


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (through a temporary file in the same folder, renamed when whole)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _complete_json(path: str) -> bool:
    """Does the file at ``path`` end like a whole JSON object (kineto reports a failed write only in its log)?"""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64))
            return f.read().rstrip().endswith(b"}")
    except OSError:
        return False


class StepProfiler:
    """A ``torch.profiler.profile`` on the blog's schedule, or a no-op when disabled."""

    def __init__(
        self,
        folder: str,
        rank: int,
        total_steps: int,
        active: int = 5,
        enabled: bool = True,
        cuda: bool = False,
        gzip: bool = False,
        memory: bool = True,
    ):
        self.folder, self.rank, self.enabled = folder, rank, enabled
        self.path = trace_path(folder, rank, gzip)
        self.gzip = gzip
        self.error: str | None = None  # why the trace could not be written, if it could not
        warmup = 1 if total_steps > 1 else 0  # a 1-step run has nothing to warm up with
        self.active = max(1, min(active, total_steps - warmup))
        quiet_kineto()
        if enabled and memory:
            hush_allocator_warning()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])  # step 1
        self._prof = (
            profile(
                activities=activities,
                schedule=schedule(wait=0, warmup=warmup, active=self.active, repeat=1),  # step 2
                on_trace_ready=self._export,
                record_shapes=True,
                profile_memory=memory,
            )
            if enabled
            else None
        )

    def _export(self, prof: profile) -> None:  # step 3
        from minddp.runtime.hang import alone

        raw = os.path.join(self.folder, f".rank{self.rank}.pt.trace.json.tmp-{os.getpid()}")
        packed = raw + ".gz"
        try:
            with alone("exporting the profiler trace"):  # ranks export at the same step; one may take longer
                os.makedirs(self.folder, exist_ok=True)
                prof.export_chrome_trace(raw)  # kineto writes raw + ".tmp", then renames it to raw
                if not _complete_json(raw):
                    raise OSError("the profiler could not write the trace (a full disk, or a file size limit)")
                if self.gzip:
                    with open(raw, "rb") as fin, gzip_open(packed, "wb") as fout:
                        shutil.copyfileobj(fin, fout)
                    os.replace(packed, self.path)
                else:
                    os.replace(raw, self.path)
        except (OSError, RuntimeError) as exc:
            self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        finally:
            for leftover in (raw, raw + ".tmp", packed):  # a partial file is never left behind
                _remove(leftover)

    @property
    def written(self) -> str | None:
        """The trace's path once it is written, else None."""
        return self.path if self.enabled and self.error is None and os.path.exists(self.path) else None

    def __enter__(self) -> "StepProfiler":
        if self._prof is not None:
            self._prof.__enter__()
            job = job_id()
            if job is not None:  # added while the profiler runs, so the export holds it
                self._prof.add_metadata_json(JOB, json.dumps(job))
        return self

    def step(self) -> None:
        if self._prof is not None:
            self._prof.step()

    def __exit__(self, *exc) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)


def tiny_run(folder: str, stage: str = "simple") -> str:
    """A tiny profiled run on this rank, to read a trace without training anything: 3 steps (one warm-up, two
    recorded), each a 64 x 64 matmul and two all_reduces (16,384 and 40 bytes), saved as ``<folder>/<stage>/``,
    the layout of a run folder. Returns the trace's path."""
    import torch
    import torch.distributed as dist

    from minddp.runtime.device import message_device

    device = message_device()  # the CPU on gloo, as the examples run
    with StepProfiler(os.path.join(folder, stage), rank=dist.get_rank(), total_steps=3, active=2) as prof:
        for _ in range(3):
            dist.all_reduce(torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device))
            dist.all_reduce(torch.ones(10, device=device))
            prof.step()
    return prof.path
