"""A :class:`~minddp.model.step.StepProfile` from a profiled step: the trace of a run with ``--link``.

A run with a link (any link, ``loopback`` included: it adds no delay, only
the ranges) leaves in each rank's trace what the model needs, per profiled
step (``ProfilerStep#N``):

* ``minddp.link:<kind>`` transfers (:meth:`minddp.comm.link.Link.annotate_trace`):
  per message its bytes, when it was handed over, when its modeled transfer
  ended, and when it was delivered;
* ``gloo:<kind>`` ranges on gloo's thread: when the real collective ended
  (the n-th message is the n-th real collective of its kind and size: gloo
  runs them in the order they were queued);
* ``minddp.finish_gradient_synchronization`` (the loop's range) and the
  ``minddp.bucket_launch`` ranges: where an async stage waits.

From them, per step:

1. **waits** (wall clock): a stage that waits right away (:data:`~minddp.model.step.WAITS`)
   stands still from each hand-over to that message's delivery; one that
   waits later stands still from its wait point (the start of
   ``finish_gradient_synchronization``; for ``ddp`` and torch's DDP, which
   wait at the end of backward, the end of the last launch) to the last
   delivery;
2. **the compute clock**: a moment's compute time is its time since the step
   began minus the waiting before it; the step's ``compute`` is the step's
   length minus all waiting;
3. **messages**: hand-over and wait point on that clock, bytes, and ``real``
   = the real collective's end minus the hand-over (never below 0);
4. ``late`` = the median, over the step's messages, of delivery minus the
   later of modeled end and real end: how late the emulation delivers.

Example::

    >>> profiles = step_profiles("traces/run/bucket-async/rank0.pt.trace.json.gz", "bucket-async", world=2)
    >>> typical(profiles).compute
"""

from __future__ import annotations

import statistics
from pathlib import Path

from minddp.analysis import metrics
from minddp.analysis.events import read_trace
from minddp.analysis.steps import bytes_of, end_of, step_windows
from minddp.model.step import WAITS, Message, StepProfile


class ProfileError(ValueError):
    """A trace the model cannot read a step from; the message says what to do."""


def step_profiles(path, stage: str, world: int, rank: int = 0) -> list[StepProfile]:
    """One :class:`StepProfile` per profiled step of one rank's trace (module doc, steps 1-4)."""
    if stage not in WAITS:
        raise ProfileError(f"the model knows the stages {', '.join(WAITS)}; got {stage!r}")
    trace = read_trace(Path(path), rank)
    events = trace.events
    transfers = {e["args"]["seq"]: e for e in events if e["name"].startswith("minddp.link:")}
    if not transfers:
        raise ProfileError(f"{path} holds no minddp.link transfers: profile the stage with a link "
                           "(e.g. python -m minddp.train --link loopback), so the trace says when each message "
                           "was handed over and delivered")
    comm_threads = {e["tid"] for e in events if e["name"].startswith(("gloo:", "minddp.link:"))}
    real = sorted((e for e in events if e["name"].startswith("gloo:") and e["tid"] in comm_threads),
                  key=lambda e: e["ts"])
    finishes = [e for e in events if e["name"] == "minddp.finish_gradient_synchronization"]
    launches = [e for e in events if e["name"].startswith("minddp.bucket_launch#")]
    real_end = _match_real(sorted(transfers.values(), key=lambda e: e["args"]["seq"]), real)
    profiles = []
    for number, s0, s1 in step_windows(events, comm_threads):
        mine = sorted((t for t in transfers.values() if s0 <= t["args"]["handed_over_ts"] < s1),
                      key=lambda t: t["args"]["seq"])
        if mine:
            profiles.append(_one_step(stage, world, s0, s1, mine, real_end, finishes, launches,
                                      f"{path} step {number}"))
    if not profiles:
        raise ProfileError(f"{path}: no profiled step sent anything over the link")
    return profiles


def _match_real(transfers: list[dict], real: list[dict]) -> dict[int, float]:
    """seq -> end of the real collective that carried it: the next one of the same kind and bytes, in order.

    The real collective is queued just before the hand-over (and on loopback
    may even end before it), so it is matched by order, not by time.
    """
    out, cursor = {}, 0
    for t in transfers:
        kind, nbytes = t["name"].split(":", 1)[1], t["args"]["bytes"]
        for i in range(cursor, len(real)):
            r = real[i]
            if r["name"] == f"gloo:{kind}" and (not r.get("args", {}).get("Input Dims") or bytes_of(r) == nbytes):
                out[t["args"]["seq"]] = end_of(r)
                cursor = i + 1
                break
    return out


def _one_step(stage, world, s0, s1, mine, real_end, finishes, launches, source) -> StepProfile:
    handed = [t["args"]["handed_over_ts"] for t in mine]
    delivered = [end_of(t) for t in mine]
    if WAITS[stage] == "now":                                                                  # step 1
        waits = list(zip(handed, delivered))
        wait_points = handed
    else:
        point = _wait_point(stage, s0, s1, handed[-1], finishes, launches)
        waits = [(point, max(point, max(delivered)))]
        wait_points = [point] * len(mine)
    waits = metrics.merge(waits)

    def clock(t: float) -> float:                                                              # step 2
        return (t - s0 - metrics.length(metrics.intersect(waits, [(s0, t)]))) / 1e6

    messages, late = [], []
    for t, h, w, d in zip(mine, handed, wait_points, delivered):
        seq = t["args"]["seq"]
        end = min(real_end.get(seq, h), d)    # gloo's range may close after its result was handed back
        messages.append(Message(at=clock(h), wait_at=clock(max(w, h)), nbytes=int(t["args"]["bytes"]),  # step 3
                                kind=t["name"].split(":", 1)[1], real=max(0.0, end - h) / 1e6))
        late.append(max(0.0, d - max(t["args"]["modeled_end_ts"], end)) / 1e6)                 # step 4
    return StepProfile(stage, world, clock(s1), messages, statistics.median(late), source)


def _wait_point(stage, s0, s1, last_handed, finishes, launches) -> float:
    """Where an async stage starts waiting (step 1)."""
    if stage in ("ddp", "torch"):       # they wait inside backward, right after launching the last bucket
        around = [end_of(e) for e in launches if e["ts"] <= last_handed <= end_of(e)]
        return max(around) if around else last_handed
    points = [e["ts"] for e in finishes if s0 <= e["ts"] < s1 and e["ts"] >= last_handed - 1]
    return min(points) if points else last_handed


def typical(profiles: list[StepProfile]) -> StepProfile:
    """The profile whose compute time is the median of ``profiles`` (a real step, not an average of steps)."""
    ordered = sorted(profiles, key=lambda p: p.compute)
    return ordered[(len(ordered) - 1) // 2]


__all__ = ["ProfileError", "step_profiles", "typical"]
