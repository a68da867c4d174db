"""The bucket lesson in numbers: what a bucket plan costs on a link, and links sized to this machine's compute.

A bucketed stage sends fewer, larger messages than a per-gradient one. On a link where a message of
``m`` bytes between ``n`` ranks takes ``2(n−1)·α + 2(n−1)/n · m·β`` (α: a fixed cost per message, s;
β: time per byte, s/B), that trades three things (docs/ladder.md, "The bucket lesson"):

1. **per message**: every all_reduce pays ``2(n−1)·α`` however few its bytes; ``k`` buckets pay it ``k``
   times, a per-gradient stage once per gradient tensor;
2. **the late start**: nothing is handed to the link before some bucket's last gradient is ready (the
   first message is the bucket that fills first, which need not be the plan's first: ``first_at``); a
   per-gradient stage sends its first gradient at once;
3. **the last bucket's tail**: the last bucket is ready only at the end of backward, so its whole
   transfer comes after backward and cannot hide; a per-gradient stage's last message is one tensor.

One NIC carries the messages one at a time, so the link's work ends at ``max over k of (hand-over of
message k + the transfers of k and of every message after it)`` (:func:`queue_end`): message 1 gives
the *start-limited* end (late start + all the link's work), the last message the *tail-limited* one. The
communication exposed after backward is that end minus the end of backward. :func:`plan_costs` gives
the three costs and the predicted step for a compute profile, a stage and a cap (the replay of
:func:`~minddp.costmodel.step.predict`); :func:`link_like` sizes a link to this machine's compute so that
bytes and messages cost, relative to one backward, what they cost in another setting (the blog's).

Example (two 4 MB gradients, ready 10 ms into a 40 ms backward and at its end; 1 Gbit/s, 2 ranks)::

    >>> from minddp.costmodel.compute import ComputeProfile
    >>> cp = ComputeProfile(nbytes=[4_000_000, 4_000_000], forward=0.02, backward=0.04, ready=[0.04, 0.01])
    >>> per_gradient = plan_costs(cp, "hook-async", None, "1gbit", world=2)
    >>> one_bucket = plan_costs(cp, "bucket-async", 25, "1gbit", world=2)
    >>> [(c.messages, round(1e3 * c.first_at), round(1e3 * c.tail, 1)) for c in (per_gradient, one_bucket)]
    [(2, 10, 32.1), (1, 40, 64.1)]
    >>> round(1e3 * per_gradient.after_backward, 1)  # start-limited: 10 + 64.2 ms of link work − 40 ms
    34.2
    >>> round(1e3 * one_bucket.after_backward, 1)    # tail-limited: the whole bucket after backward
    64.1
    >>> queue_end(sent=[0.0, 1.0], durations=[5.0, 1.0]), queue_end(sent=[0.0, 10.0], durations=[1.0, 3.0])
    ((6.0, 0), (13.0, 1))
    >>> row = {"forward": [(0, 10)], "backward": [(10, 30)], "optimizer": [(36, 40)], "waits": [(30, 36)],
    ...        "messages": [(20, 26), (26, 36)], "sent": [20.0, 25.0]}   # a profiled step, in ms
    >>> seen = on_the_link(row)
    >>> seen["link_ms"], seen["overlap_pct"], seen["first_ms"], seen["end_ms"], seen["limit"]
    (16.0, 62.5, 10.0, 6.0, 'start')
"""

from __future__ import annotations

from dataclasses import dataclass

from minddp.analysis.timeline import row_measures
from minddp.comm.link import LinkSpec, parse_link
from minddp.costmodel.compute import ComputeProfile, plan_for, synthesize
from minddp.costmodel.step import predict


def on_the_link(row: dict) -> dict:
    """One profiled step over an emulated link (a row of :mod:`minddp.analysis.timeline`, ms) in the blog's
    terms and in the terms of the module doc.

    * the step's measures, :func:`minddp.analysis.timeline.row_measures`: ``overlap_pct`` (of the link's
      transfers, against compute: a forward, a backward or the optimizer, not waiting), ``non_compute_ms`` (the
      transfers' time while nothing computed), ``interleaved_ms``, and where the row knows its waits
      (``row["link"]``) ``waited_ms`` and ``exposed_ms``; ``link_ms``: the transfers' time in flight, the link's
      work;
    * ``first_ms``: the first hand-over, after the last backward began; ``tail_ms``: the last message's own
      transfer; ``start_end_ms`` / ``tail_end_ms``: when the link would be done if message 1 / the last one
      set its end (:func:`queue_end`), after the end of the last backward; ``limit``: which did.
    """
    measures = row_measures(row)
    start, end = row["backward"][-1]
    sent = sorted(row["sent"])
    durations = [e - s for s, e in sorted(row["messages"])]
    done, which = queue_end(sent, durations)
    return {
        **measures,
        "link_ms": measures["in_flight_ms"],
        "messages": len(sent),
        "first_ms": sent[0] - start if sent else 0.0,
        "tail_ms": durations[-1] if durations else 0.0,
        "start_end_ms": sent[0] + sum(durations) - end if sent else 0.0,
        "tail_end_ms": sent[-1] + durations[-1] - end if sent else 0.0,
        "end_ms": done - end if sent else 0.0,
        "limit": ("start" if which == 0 else "tail" if which == len(sent) - 1 else f"message {which + 1}")
        if sent
        else "",
    }


def queue_end(sent: list[float], durations: list[float]) -> tuple[float, int]:
    """When one NIC, taking messages in the order handed over, is done: ``(end, k)``, ``k`` the message whose
    hand-over set it (0: the first, start-limited; the last: tail-limited). Any unit of time."""
    best, which, after = float("-inf"), 0, 0.0
    for k in reversed(range(len(sent))):
        after += durations[k]
        if sent[k] + after >= best:
            best, which = sent[k] + after, k
    return best, which


@dataclass
class PlanCosts:
    """The three costs of one stage's plan on one link (seconds; module doc), and the replay's prediction."""

    stage: str
    cap_mb: float | None
    first_mb: float | None
    messages: int
    per_message: float  # 2(n−1)·α: one message's fixed cost
    link: float  # every transfer of the step's sync, back to back
    first_at: float  # the first message ready (its last gradient in), after the last backward began
    first_gradients: int  # gradients in the first message
    last_bytes: int
    tail: float  # the last message's own transfer
    #: the link's time still to run when the modeled backward ends (the replay's ``exposed``): notebook 03's *link
    #: after backward*, kept apart by its name from the measured *exposed* of a profiled step
    after_backward: float
    overlap_pct: float
    step: float
    #: the link's queue (:func:`queue_end`, the buckets handed over when ready): done this long after backward ends,
    #: an end set by message ``set_by`` (0: the first) of ``messages``, ready ``set_by_ready`` before backward ends,
    #: after which it and the messages behind it need ``set_by_carry`` on the link
    done_after: float = 0.0
    set_by: int = 0
    set_by_ready: float = 0.0
    set_by_carry: float = 0.0

    @property
    def fixed(self) -> float:
        """What the messages cost for being messages: ``messages × 2(n−1)·α``."""
        return self.messages * self.per_message

    def row(self) -> dict:
        return {
            "buckets": self.messages,
            "fixed costs, ms (buckets × 2(n−1)·α)": 1e3 * self.fixed,
            "first message ready, ms into the model's backward": 1e3 * self.first_at,
            "last message's transfer, ms": 1e3 * self.tail,
            "link, ms": 1e3 * self.link,
            "link after backward, ms (step-time model)": 1e3 * self.after_backward,
        }


def plan_costs(
    cp: ComputeProfile,
    stage: str,
    cap_mb: float | None,
    link: LinkSpec | str,
    world: int,
    first_mb: float | None = None,
) -> PlanCosts:
    """Steps 1-3 of the module doc for ``stage`` with ``cap_mb`` (and a first bucket of ``first_mb``) on ``link``."""
    spec = parse_link(link)
    plan = plan_for(cp, stage, cap_mb, first_mb)
    ready = [max(cp.ready[i] for i in bucket) for bucket in plan]
    sizes = [sum(cp.nbytes[i] for i in bucket) for bucket in plan]
    first, last = min(range(len(plan)), key=ready.__getitem__), max(range(len(plan)), key=ready.__getitem__)
    p = predict(synthesize(cp, stage, cap_mb, world, first_mb).on_real_network(), spec)
    order = sorted(range(len(plan)), key=ready.__getitem__)
    durations = [spec.seconds("all_reduce", sizes[i], world) for i in order]
    done, k = queue_end([ready[i] for i in order], durations)
    return PlanCosts(
        stage=stage,
        cap_mb=cap_mb,
        first_mb=first_mb,
        messages=len(plan),
        per_message=spec.seconds("all_reduce", 0, world),
        link=sum(spec.seconds("all_reduce", b, world) for b in sizes),
        first_at=ready[first],
        first_gradients=len(plan[first]),
        last_bytes=sizes[last],
        tail=spec.seconds("all_reduce", sizes[last], world),
        after_backward=p.exposed,
        overlap_pct=p.overlap_pct,
        step=p.step,
        done_after=done - cp.backward,
        set_by=k,
        set_by_ready=cp.backward - ready[order[k]],
        set_by_carry=sum(durations[k:]),
    )


def ratios(cp: ComputeProfile, link: LinkSpec | str, world: int) -> tuple[float, float]:
    """``(bytes, per message)``: one sync's bytes on ``link`` at ``world`` ranks, and one message's fixed cost,
    each over ``cp``'s backward (what :func:`link_like` keeps)."""
    spec = parse_link(link)
    per_message = spec.seconds("all_reduce", 0, world)
    return (spec.seconds("all_reduce", cp.total_bytes, world) - per_message) / cp.backward, per_message / cp.backward


def link_like(
    name: str, backward_s: float, sync_bytes: int, bytes_ratio: float, message_ratio: float, world: int, about=""
) -> LinkSpec:
    """A link on which, for a model whose backward takes ``backward_s`` and whose sync is ``sync_bytes``, one
    sync's bytes take ``bytes_ratio`` backwards and one message's fixed cost ``message_ratio`` (see :func:`ratios`).

    So a setting keeps its shape on any machine: a faster machine gets a faster link.
    """
    share = 2 * (world - 1) / world  # an all_reduce's bytes cross 2(n−1)/n times (minddp.comm.link)
    bandwidth = share * sync_bytes / (bytes_ratio * backward_s)
    latency = message_ratio * backward_s / (2 * (world - 1))
    return LinkSpec(name, bandwidth, latency, about)


__all__ = ["PlanCosts", "plan_costs", "queue_end", "on_the_link", "ratios", "link_like"]
