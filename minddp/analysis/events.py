"""Finding and loading a run's traces, and refusing what cannot be analysed.

A run folder (``python -m minddp.train`` writes it; docs/analysis.md shows the layout) holds
``<stage>/rank<r>.pt.trace.json[.gz]`` and ``<stage>/config.json``. Loading stops at the first
problem with a :class:`TraceError` that names it and says what to do:

1. the folder holds at least one stage folder with rank traces (or *is* a stage folder);
2. every trace file parses (a truncated ``.json`` or ``.gz`` is named);
3. the traces belong together: the stages' ``config.json`` name the same run, the rank files match
   its ``world_size``, and one stage's ranks were recorded at the same time (their ranges overlap).

Example (on one rank; the trace of a tiny run)::

    >>> import os, tempfile
    >>> from minddp.runtime.profiling import tiny_run
    >>> run = tempfile.TemporaryDirectory()                     # a run folder: one stage, one rank
    >>> _ = tiny_run(run.name)                                  # 3 steps, 2 recorded: a matmul, two all_reduces
    >>> run_traces = load_run(run.name)
    >>> sorted(run_traces.stages), sorted(run_traces.stages["simple"].ranks)
    (['simple'], [0])
    >>> sorted({e["name"] for e in run_traces.stages["simple"].ranks[0].events if "ProfilerStep" in e["name"]})
    ['ProfilerStep#1', 'ProfilerStep#2']
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

_RANK_FILE = re.compile(r"^rank(\d+)\.pt\.trace\.json(\.gz)?$")


class TraceError(ValueError):
    """A run folder or trace that cannot be analysed; the message says why and what to do."""


@dataclass
class RankTrace:
    """One rank's trace: its complete (``ph == "X"``) events and its thread names."""

    rank: int
    path: Path
    events: list[dict]
    thread_names: dict = field(default_factory=dict)  # tid -> name
    meta: dict = field(default_factory=dict)  # top-level keys other than traceEvents
    #: what the analysis derived from ``events`` once (intervals, ...), so each table does not redo it
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    def span(self) -> tuple[float, float]:
        return (min(e["ts"] for e in self.events), max(e["ts"] + e.get("dur", 0) for e in self.events))


@dataclass
class StageTraces:
    name: str
    path: Path
    config: dict
    ranks: dict[int, RankTrace]


@dataclass
class Run:
    name: str
    path: Path
    stages: dict[str, StageTraces]


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cycle collector while a block builds (or walks) millions of small objects.

    A trace is about a million dicts, lists and strings. Each time a block allocates some
    thousands of objects the collector runs, and its full passes walk every object alive, the
    traces already loaded included: with it running, loading a run took 10-15x longer than
    parsing its JSON. Nothing here builds reference cycles, so nothing waits on the collector:
    reference counting frees it all as usual. The collector resumes (if it was on) when the
    block ends, however it ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_trace(path: Path, rank: int) -> RankTrace:
    """Step 2: parse one trace file; a broken file is a :class:`TraceError` naming it."""
    path = Path(path)
    with gc_paused():
        return _read_trace(path, rank)


def _read_trace(path: Path, rank: int) -> RankTrace:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
        raise TraceError(
            f"trace {path} is not readable JSON ({type(exc).__name__}: {exc}); it is probably "
            "truncated (the run was interrupted while writing it): re-run the profile"
        ) from None
    raw = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise TraceError(f"trace {path} has no 'traceEvents' list: it is not a PyTorch profiler trace")
    events, threads = [], {}
    for e in raw:
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "X" and "ts" in e and "name" in e:
            events.append(e)
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e.get("tid")] = str(e.get("args", {}).get("name", ""))
    if not events:
        raise TraceError(f"trace {path} holds no timed events: profile at least one active step")
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    return RankTrace(rank, path, events, threads, meta)


def _rank_files(folder: Path) -> dict[int, Path]:
    found = {}
    for p in sorted(folder.iterdir()):
        m = _RANK_FILE.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} is not valid JSON ({exc}): re-run the profile or delete the file") from None
    return config if isinstance(config, dict) else {}


def _run_name(config: dict) -> str | None:
    value = config.get("run_name", config.get("run"))
    return str(value) if value else None


def load_stage(folder: Path, name: str | None = None) -> StageTraces:
    folder = Path(folder)
    files = _rank_files(folder)
    config = _read_config(folder)
    ranks = {r: read_trace(p, r) for r, p in files.items()}  # step 2
    # "ranks" = processes this stage ran on (1 for the single-process baseline of a
    # 2-rank run); older configs only have the run's world_size.
    key = "ranks" if "ranks" in config else "world_size"
    world = config.get(key)
    if world is not None and sorted(ranks) != list(range(int(world))):  # step 3
        raise TraceError(
            f"{folder} holds traces of ranks {sorted(ranks)} but its config.json says "
            f"{key}={world}: traces of different runs are mixed; re-run the profile into "
            "an empty folder"
        )
    _check_recorded_together(folder, ranks)
    return StageTraces(name or config.get("stage") or folder.name, folder, config, ranks)


#: Ranks of one job may record their steps a little apart (ranks that never communicate, as the
#: single-process baseline, drift by the profiler's own start-up); a new run takes longer than this to start.
SAME_RUN_GAP_US = 2e6


def _check_recorded_together(folder: Path, ranks: dict[int, RankTrace]) -> None:
    """Ranks of one job run at the same time: their traces' time ranges overlap, or nearly (``SAME_RUN_GAP_US``)."""
    spans = {r: t.span() for r, t in ranks.items()}
    latest_start = max(s for s, _ in spans.values())
    earliest_end = min(e for _, e in spans.values())
    if latest_start - earliest_end > SAME_RUN_GAP_US:
        raise TraceError(
            f"the rank traces in {folder} were not recorded at the same time (their time ranges are "
            f"{(latest_start - earliest_end) / 1e6:.0f} s apart): traces of different runs are mixed; "
            "re-run the profile into an empty folder"
        )


def load_run(path) -> Run:
    """Load every stage of the run in ``path`` (or the single stage ``path`` is)."""
    path = Path(path)
    if not path.is_dir():  # step 1
        raise TraceError(
            f"trace folder {path} does not exist: pass traces/<run> as written by python -m minddp.train --profile"
        )
    if _rank_files(path):
        stage_dirs = [path]
    else:
        stage_dirs = [d for d in sorted(path.iterdir()) if d.is_dir() and _rank_files(d)]
    if not stage_dirs:
        raise TraceError(
            f"no rank traces (<stage>/rank<r>.pt.trace.json[.gz]) under {path}: "
            "run python -m minddp.train --profile first, or point at the run's folder"
        )
    stages = {}
    for d in stage_dirs:
        st = load_stage(d)
        if st.name in stages:
            raise TraceError(
                f"stage {st.name!r} appears twice under {path} ({stages[st.name].path} and {d}): "
                "keep one run per folder"
            )
        stages[st.name] = st
    names = {n for n in (_run_name(st.config) for st in stages.values()) if n}
    if len(names) > 1:  # step 3
        raise TraceError(
            f"the stages under {path} come from different runs ({', '.join(sorted(names))}): "
            "keep one run per folder, or compare runs with --compare RUN_A RUN_B"
        )
    run_name = names.pop() if names else (path.name if stage_dirs[0] != path else path.parent.name)
    return Run(run_name, path, stages)
