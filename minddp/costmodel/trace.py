"""A :class:`~minddp.costmodel.step.StepProfile` from a profiled step: the trace of a run with ``--link``.

A run with a link (``loopback`` included: it adds no delay) leaves per profiled step the link's
transfers, gloo's real collectives and the loop's wait ranges; from them, per step
(docs/scaling.md, "Reading a profile from a trace", says which ranges and why):

1. **waits**: each message's wait point (its first ``wait()``, else the stage's rule,
   :data:`~minddp.costmodel.step.TRACED_WAITS`);
2. **the compute clock**: time since the step began minus the waiting before it;
3. **messages**: hand-over and wait point on that clock, bytes, ``real`` (real end minus hand-over);
4. ``late``: the median delay of the emulation's delivery.

Example (on one rank; a tiny run with a link, profiled)::

    >>> import tempfile
    >>> run = tempfile.TemporaryDirectory()
    >>> path = tiny_run_on_link(run.name, "1gbit")      # bucket-async, 3 steps, its messages on 1gbit (see its code)
    >>> profiles = step_profiles(path, "bucket-async", world=1)
    >>> len(profiles), [(m.kind, m.nbytes) for m in profiles[0].messages]   # one bucket: 256·256 + 256 floats
    (2, [('all_reduce', 263168)])
    >>> typical(profiles) in profiles                             # a real step, not an average
    True
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from minddp.analysis import metrics
from minddp.analysis.events import read_trace
from minddp.analysis.steps import bytes_of, end_of, step_windows
from minddp.costmodel.step import TRACED_WAITS, Message, StepProfile


class ProfileError(ValueError):
    """A trace the model cannot read a step from; the message says what to do."""


def step_profiles(path, stage: str, world: int, rank: int = 0) -> list[StepProfile]:
    """One :class:`StepProfile` per profiled step of one rank's trace (module doc, steps 1-4)."""
    if stage not in TRACED_WAITS:
        raise ProfileError(f"the model reads the stages {', '.join(TRACED_WAITS)}; got {stage!r}")
    trace = read_trace(Path(path), rank)
    events = trace.events
    transfers = {e["args"]["seq"]: e for e in events if e["name"].startswith("minddp.link:")}
    if not transfers:
        raise ProfileError(
            f"{path} holds no minddp.link transfers: profile the stage with a link "
            "(e.g. python -m minddp.train --link loopback), so the trace says when each message "
            "was handed over and delivered"
        )
    comm_threads = {e["tid"] for e in events if e["name"].startswith(("gloo:", "minddp.link:"))}
    real = sorted(
        (e for e in events if e["name"].startswith("gloo:") and e["tid"] in comm_threads), key=lambda e: e["ts"]
    )
    finishes = [e for e in events if e["name"] == "minddp.finish_gradient_synchronization"]
    launches = [e for e in events if e["name"].startswith("minddp.bucket_launch#")]
    real_end = _match_real(sorted(transfers.values(), key=lambda e: e["args"]["seq"]), real)
    profiles = []
    for number, s0, s1 in step_windows(events, comm_threads):
        mine = sorted(
            (t for t in transfers.values() if s0 <= t["args"]["handed_over_ts"] < s1), key=lambda t: t["args"]["seq"]
        )
        if mine:
            profiles.append(
                _one_step(stage, world, s0, s1, mine, real_end, finishes, launches, f"{path} step {number}")
            )
    if not profiles:
        raise ProfileError(f"{path}: no profiled step sent anything over the link")
    return profiles


#: The real collective's name in gloo's ranges, per kind the link carries: gloo has no Future for its own
#: reduce_scatter, so the wire sends a reduce-scatter as an all_reduce of the whole input on gloo.
REAL_NAMES = {"reduce_scatter": ("gloo:reduce_scatter", "gloo:all_reduce")}


def _match_real(transfers: list[dict], real: list[dict]) -> dict[int, float]:
    """seq -> end of the real collective that carried it: the next one of its name and bytes, in order.

    The real collective is queued just before the hand-over (and on loopback
    may even end before it), so it is matched by order, not by time: per
    gloo name, each transfer takes the first real collective after the one
    the previous transfer of that name took. The bytes gloo records are the
    first input's, which for an all_gather is one rank's part of the payload.
    """
    by_name: dict[str, list[dict]] = {}
    for r in real:
        by_name.setdefault(r["name"], []).append(r)
    out, cursor = {}, {}
    for t in transfers:
        kind, nbytes = t["name"].split(":", 1)[1], t["args"]["bytes"]
        sizes = {nbytes, nbytes // max(1, t["args"].get("ranks", 1))}
        found = []
        for name in REAL_NAMES.get(kind, (f"gloo:{kind}",)):
            events = by_name.get(name, [])
            for i in range(cursor.get(name, 0), len(events)):
                r = events[i]
                if not r.get("args", {}).get("Input Dims") or bytes_of(r) in sizes:
                    found.append((r["ts"], name, i))
                    break
        if found:
            _, name, i = min(found)
            out[t["args"]["seq"]] = end_of(by_name[name][i])
            cursor[name] = i + 1
    return out


def _one_step(stage, world, s0, s1, mine, real_end, finishes, launches, source) -> StepProfile:
    handed = [t["args"]["handed_over_ts"] for t in mine]
    delivered = [end_of(t) for t in mine]
    waited = [t["args"].get("waited_ts") for t in mine]  # step 1
    if TRACED_WAITS[stage] == "now":
        rule = handed
    else:
        unseen = [h for h, w in zip(handed, waited) if w is None] or handed
        rule = [_wait_point(stage, s0, s1, unseen[-1], finishes, launches)] * len(mine)
    wait_points = [max(h, w if w is not None else r) for h, w, r in zip(handed, waited, rule)]
    waits = metrics.merge([(w, max(w, d)) for w, d in zip(wait_points, delivered)])

    def clock(t: float) -> float:  # step 2
        return (t - s0 - metrics.waited(waits, [(s0, t)])) / 1e6

    messages, late = [], []
    for t, h, w, d in zip(mine, handed, wait_points, delivered):
        seq = t["args"]["seq"]
        end = min(real_end.get(seq, h), d)  # gloo's range may close after its result was handed back
        messages.append(
            Message(
                at=clock(h),
                wait_at=clock(w),
                nbytes=int(t["args"]["bytes"]),  # step 3
                kind=t["name"].split(":", 1)[1],
                real=max(0.0, end - h) / 1e6,
            )
        )
        late.append(max(0.0, d - max(t["args"]["modeled_end_ts"], end)) / 1e6)  # step 4
    return StepProfile(stage, world, clock(s1), messages, statistics.median(late), source)


def _wait_point(stage, s0, s1, last_handed, finishes, launches) -> float:
    """Where an async stage starts waiting for the messages whose wait the trace does not show (step 1)."""
    if stage in ("ddp", "torch", "zero1"):  # they wait inside backward, right after launching the last bucket
        around = [end_of(e) for e in launches if e["ts"] <= last_handed <= end_of(e)]
        return max(around) if around else last_handed
    points = [e["ts"] for e in finishes if s0 <= e["ts"] < s1 and e["ts"] >= last_handed - 1]
    return min(points) if points else last_handed


def typical(profiles: list[StepProfile]) -> StepProfile:
    """The profile whose compute time is the median of ``profiles`` (a real step, not an average of steps)."""
    ordered = sorted(profiles, key=lambda p: p.compute)
    return ordered[(len(ordered) - 1) // 2]


__all__ = ["ProfileError", "step_profiles", "typical"]


def tiny_run_on_link(folder: str, link: str = "1gbit", stage: str = "bucket-async") -> str:
    """A tiny profiled run of ``stage`` on this rank with every message through an emulated ``link``: 3 steps
    (one warm-up, two recorded) of a 256 x 256 linear layer, one bucket each, and the link's transfers placed in
    the trace (:meth:`minddp.comm.link.Link.annotate_trace`), saved as ``<folder>/<stage>/``. Returns the trace's
    path: what :func:`step_profiles` reads."""
    import torch

    from minddp.comm.link import Link
    from minddp.comm.wire import Wire
    from minddp.ladder import make_optimizer, wrap
    from minddp.ladder.loop import train_step
    from minddp.runtime.profiling import StepProfiler

    emulated = Link(link)
    wire = Wire(None, link=emulated)
    model = wrap(stage, torch.nn.Linear(256, 256), bucket_cap_mb=25, wire=wire)
    optimizer = make_optimizer(stage, model, torch.optim.SGD, wire=wire, lr=0.01)
    with StepProfiler(os.path.join(folder, stage), 0, total_steps=3, active=2, memory=False) as prof:
        for _ in range(3):
            train_step(model, optimizer, [torch.ones(8, 256)], lambda m, x: m(x).sum())
            prof.step()
    emulated.annotate_trace(prof.path)
    emulated.close()
    return prof.path
