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


LINK = 300  # the emulated link's thread


def linked_step(offset: float = 0.0) -> list[dict]:
    """One step of 100 ms of a stage over an emulated link, with its phases, every measure worked out by hand.

    In ms from ``offset`` (µs): forward 0..20 and backward 20..50 (one micro-batch, 0..60), finish 55..65, optimizer
    66..85; compute (aten ops on the training thread) 0..15, 20..30, 40..50, 70..80; one all_reduce handed over at
    27, gloo running it 28..36, the link carrying it 28..58 (its modeled transfer) and delivering it at 62; the
    training thread waits for it from 55 (in finish) to 62. So communication is in flight 28..62 (34 ms), and:

    * non-compute: 30..40 and 50..62, 22 ms; inside backward (interleaved): 30..40, 10 ms;
    * overlap: 28..30 and 40..50 under compute, 12 of 34 ms;
    * waited: 55..62, 7 ms; exposed: the link's 28..58 during that wait, 55..58, 3 ms.
    """

    def at(ms):
        return offset + 1000.0 * ms

    link = {"seq": 0, "bytes": 40, "ranks": 2, "link": "1gbit", "handed_over_ts": at(27), "modeled_end_ts": at(58)}
    return [
        x("ProfilerStep#1", at(0), 100e3),
        x("minddp.forward_backward", at(0), 60e3),
        x("aten::mm", at(0), 15e3),
        x("autograd::engine::evaluate_function: MmBackward0", at(20), 30e3),
        x("aten::mm", at(20), 10e3),
        x("minddp.bucket_launch#0 numel=10 dtype=float32 hook=allreduce_hook", at(26), 2e3),
        x("c10d::allreduce_", at(26.5), 1e3, **{"Input Dims": [[[10]], []], "Input type": ["TensorList", ""]}),
        x("minddp.link_send#0", at(27), 500),
        x("aten::mm", at(40), 10e3),
        x("minddp.finish_gradient_synchronization", at(55), 10e3),
        x("minddp.optimizer_step", at(66), 19e3),
        x("aten::add", at(70), 10e3),
        x("gloo:all_reduce", at(28), 8e3, tid=GLOO, **{"Input Dims": [[10]], "Input type": ["float"]}),
        x("minddp.link:all_reduce", at(28), 34e3, tid=LINK, **link, waited_ts=at(55)),
    ]
