"""Finding and loading a run's traces, and refusing what cannot be analysed.

A run folder (``python -m minddp.train`` writes it; docs/analysis.md shows the layout) holds
``<stage>/rank<r>.pt.trace.json[.gz]`` and ``<stage>/config.json``. Any other folder of per-rank
profiler traces reads too (a user's own torch DDP traces, HTA's samples, a GPU report's): every
``*.json`` or ``*.json.gz`` file whose top holds a profiler trace's keys is a rank's trace, and its
rank is the one its ``distributedInfo`` names (the rank HTA reads), else a number after ``rank``
in its name. Loading stops at the first problem with a :class:`TraceError` that names it and says
what to do:

1. the folder holds at least one folder of rank traces (itself, or its subfolders: one stage each);
2. every trace file parses (a truncated ``.json`` or ``.gz`` is named), and each rank has one;
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
    >>> os.rename(f"{run.name}/simple/rank0.pt.trace.json", f"{run.name}/simple/worker-a.json")  # any name
    >>> rank_files(Path(run.name, "simple"))                   # the rank from the trace's distributedInfo
    {0: PosixPath('.../simple/worker-a.json')}
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

from minddp.runtime.profiling import JOB

#: minddp's own name for a rank's trace (``python -m minddp.train`` writes these).
_RANK_FILE = re.compile(r"^rank(\d+)\.pt\.trace\.json(\.gz)?$")
#: A rank in any other trace's name: ``rank-0``, ``sampled_rank_1``, ``Rank3``.
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
#: The top of a trace, read to tell a trace from other JSON and to find its rank: torch's profiler
#: (Kineto) writes ``schemaVersion``, the devices and ``distributedInfo`` before ``traceEvents``.
HEAD_CHARS = 1 << 18
_TRACE_KEY = re.compile(r'"(?:traceEvents|schemaVersion)"\s*:')
_DISTRIBUTED_RANK = re.compile(r'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
#: Files beside traces that are never one: a stage's settings, a run's summary.
NOT_TRACES = ("config.json", "summary.json")


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


def _unreadable(path: Path, exc: BaseException) -> TraceError:
    return TraceError(
        f"trace {path} is not readable JSON ({type(exc).__name__}: {exc}); it is probably "
        "truncated (the run was interrupted while writing it): re-run the profile"
    )


def _open_text(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", encoding="utf-8")


def _read_trace(path: Path, rank: int) -> RankTrace:
    try:
        with _open_text(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc) from None
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


def _head(path: Path) -> str:
    """The first :data:`HEAD_CHARS` characters of a JSON file (decompressed); a broken file is a TraceError."""
    try:
        with _open_text(path) as f:
            return f.read(HEAD_CHARS)
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc) from None


def trace_rank(path: Path) -> int | None:
    """Which rank the trace in ``path`` holds, or ``None`` when ``path`` is no profiler trace.

    1. a ``*.json`` or ``*.json.gz`` file (not a ``config.json`` or ``summary.json``) whose top holds
       ``traceEvents`` or ``schemaVersion`` is a trace (minddp's ``rank<r>.pt.trace.json[.gz]`` always is);
    2. its rank: ``distributedInfo``'s ``rank`` (what torch records, and HTA reads), else the number after
       ``rank`` in its name; ``-1`` when neither says (:func:`rank_files` decides or refuses).
    """
    name = path.name
    if not name.endswith((".json", ".json.gz")) or name in NOT_TRACES or not path.is_file():
        return None
    own = _RANK_FILE.match(name)
    head = _head(path)
    if not own and not _TRACE_KEY.search(head):
        return None
    recorded = _DISTRIBUTED_RANK.search(head)
    if recorded:
        return int(recorded.group(1))
    named = own or _RANK_IN_NAME.search(name)
    return int(named.group(1)) if named else -1


def rank_files(folder: Path) -> dict[int, Path]:
    """Step 1: ``{rank: trace file}`` of the traces directly in ``folder`` (see :func:`trace_rank`).

    One trace whose rank nothing names is rank 0; two traces of one rank, or several unnamed, are refused.
    """
    found: dict[int, Path] = {}
    unnamed = []
    for p in sorted(Path(folder).iterdir()):
        rank = trace_rank(p)
        if rank is None:
            continue
        if rank < 0:
            unnamed.append(p)
            continue
        if rank in found:
            raise TraceError(
                f"{folder} holds two traces of rank {rank} ({found[rank].name}, {p.name}): keep one trace "
                "per rank in a folder (one profiling window of one job), the others in folders of their own"
            )
        found[rank] = p
    if unnamed and (found or len(unnamed) > 1):
        raise TraceError(
            f"cannot tell which rank {unnamed[0]} holds: its trace has no distributedInfo and its name no "
            "rank number; rename each trace rank<N>.json (N its rank)"
        )
    if unnamed:
        found[0] = unnamed[0]
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
    files = rank_files(folder)
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


#: Ranks of one job may record their steps apart: ranks that never communicate (the single-process baseline)
#: drift by their own start-up, which on a loaded 2-core machine passed 2 s (a fresh-clone CI's notebook 05);
#: traces left from another run are minutes or hours apart. A minute keeps both sides of that line. Only traces
#: that name no job (another tool's) are judged by their clocks.
SAME_RUN_GAP_US = 60e6


def _check_recorded_together(folder: Path, ranks: dict[int, RankTrace]) -> None:
    """Ranks of one job: their traces name the same job (minddp's, :data:`~minddp.runtime.profiling.JOB`); traces
    that name none must overlap in time, or nearly (``SAME_RUN_GAP_US``)."""
    jobs = {r: t.meta.get(JOB) for r, t in ranks.items()}
    if len(set(jobs.values())) > 1:
        named = ", ".join(f"rank {r}: {job or 'none'}" for r, job in sorted(jobs.items()))
        raise TraceError(
            f"the rank traces in {folder} come from different jobs ({named}): traces of different runs are "
            "mixed; re-run the profile into an empty folder"
        )
    if next(iter(jobs.values())) is not None:
        return
    spans = {r: t.span() for r, t in ranks.items()}
    latest_start = max(s for s, _ in spans.values())
    earliest_end = min(e for _, e in spans.values())
    if latest_start - earliest_end > SAME_RUN_GAP_US:
        raise TraceError(
            f"the rank traces in {folder} were not recorded at the same time (their time ranges are "
            f"{(latest_start - earliest_end) / 1e6:.0f} s apart): traces of different runs are mixed; "
            "re-run the profile into an empty folder"
        )


def trace_folders(path: Path, depth: int = 3) -> list[Path]:
    """The folders up to ``depth`` levels below ``path`` that hold rank traces directly (for a hint)."""
    found = []
    for d in sorted(p for p in Path(path).iterdir() if p.is_dir()):
        with contextlib.suppress(TraceError, OSError):
            if rank_files(d):
                found.append(d)
                continue
        if depth > 1:
            found += trace_folders(d, depth - 1)
    return found


def load_run(path) -> Run:
    """Load every stage of the run in ``path``: its subfolders of rank traces, or ``path`` itself when it holds them."""
    path = Path(path)
    if not path.is_dir():  # step 1
        raise TraceError(
            f"trace folder {path} does not exist: pass traces/<run> as written by python -m minddp.train "
            "--profile, or a folder of per-rank profiler traces"
        )
    if rank_files(path):
        stage_dirs = [path]
    else:
        stage_dirs = [d for d in sorted(path.iterdir()) if d.is_dir() and rank_files(d)]
    if not stage_dirs:
        deeper = [str(d.parent) for d in trace_folders(path)]
        hint = (
            f"the traces lie deeper, in {', '.join(dict.fromkeys(deeper))}: point at one of those"
            if deeper
            else "run python -m minddp.train --profile first, or point at a folder of per-rank traces"
        )
        raise TraceError(
            f"no rank traces under {path} (<stage>/rank<r>.pt.trace.json[.gz] as the train command writes, "
            f"or any torch profiler traces *.json[.gz], one per rank): {hint}"
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
    # a stage folder of a train run is named by its run's folder; any other folder of traces by itself
    stage_of_a_run = stage_dirs[0] == path and (path / "config.json").exists()
    run_name = names.pop() if names else (path.parent.name if stage_of_a_run else path.name)
    return Run(run_name, path, stages)
