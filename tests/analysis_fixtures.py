"""Tiny hand-made traces for the analysis tests: events whose answers can be worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

MAIN, GLOO = 100, 200  # thread ids: the training thread and a gloo worker


def x(name, ts, dur, tid=MAIN, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write_trace(path: Path, events: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": GLOO, "args": {"name": "pt_gloo_runloop"}}]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": meta + events}))
    return path


def half_covered_step(offset: float = 0.0) -> list[dict]:
    """One step [0, 100): compute [0, 40), one all_reduce of 10 floats running [20, 60).

    By hand: compute 40, comm not under compute 20 (40..60), idle 40; overlap 20/40 = 50 %;
    1 call of 40 bytes; the bucket was ready at 15, launched at 25, reduced 20..60.
    """
    o = offset
    return [
        x("ProfilerStep#1", o + 0, 100),
        x("aten::mm", o + 0, 40),
        x("aten::t", o + 5, 5),  # nested inside aten::mm: must count once
        x("minddp.bucket_launch#0 numel=10 dtype=float32 hook=allreduce_hook", o + 15, 10),
        x("c10d::allreduce_", o + 16, 2, **{"Input Dims": [[[10]], []], "Input type": ["TensorList", ""]}),
        x("gloo:all_reduce", o + 20, 40, tid=GLOO, **{"Input Dims": [[10]], "Input type": ["float"]}),
    ]


def write_stage(folder: Path, events_by_rank: dict[int, list[dict]], **config) -> Path:
    for rank, events in events_by_rank.items():
        write_trace(folder / f"rank{rank}.pt.trace.json", events)
    if config:
        (folder / "config.json").write_text(json.dumps(config))
    return folder
