"""The measures, one function each, on plain time intervals: the one definition every table, figure and notebook uses.

A step reduces to sets of ``(start, end)`` intervals (docs/analysis.md, "The three interval sets", says what
each is on CPU and on GPU; :func:`minddp.analysis.timeline.row_sets` reads them off a step row): the **window**
under study, **compute**, **comm** (communication in flight), and where they are known the step's **backward**
spans, the training thread's **waits** for communication, and an emulated **link**'s modeled transfers. With
``|X|`` the length of the union of the intervals of ``X``, the measures (docs/analysis.md, "The measures": name,
definition, function, unit):

1. **in flight**, :func:`in_flight`: ``|comm ∩ window|``;
2. **non-compute**, :func:`non_compute`: ``|(comm ∖ compute) ∩ window|``, communication in flight while nothing
   computes; over ``|window|`` it is HolisticTraceAnalysis's non-compute share (:func:`breakdown`);
3. **overlap**, :func:`overlap_pct`: ``100 · |comm ∩ compute ∩ window| / |comm ∩ window|`` (0 without comm);
   pooled over several steps or ranks as one ratio of sums (:func:`overlap_parts`, :func:`pooled_overlap_pct`);
4. **interleaved**, :func:`interleaved`: ``|(comm ∖ compute) ∩ backward|``, the non-compute time inside backward:
   communication between two pieces of backward's compute, in the training thread's order, with none beside it;
5. **waited**, :func:`waited`: ``|waits ∩ window|``, the training thread standing still for communication;
6. **exposed**, :func:`exposed`: ``|link ∩ waits ∩ window|``, the link's modeled transfers the training thread
   waited through. Not the time a free link (one whose transfers take no time) would save: a wait that covers a
   transfer may last as long for the other rank, and a faster link also shortens the other rank's transfers (the
   step-time model's replay gives it on its own transfers and waits, :func:`minddp.costmodel.step.predict`);
7. **link time**, :func:`link_time`: the modeled transfer time of the step's messages, from their sizes alone;
8. **comm cost**, :func:`comm_cost`: a stage's step time minus the same stage's with nothing sent (``noop_hook``),
   from two runs (``python -m minddp.bench``): all that sending adds, the link and every wait and the collectives'
   own work, where exposed is the link's part alone.

The temporal breakdown (:func:`breakdown`) splits the window into compute, non-compute and idle, as HTA does.
These are HolisticTraceAnalysis's definitions where HTA has one, written on intervals so that they apply where
HTA cannot go. Below them, the interval algebra every measure is written in: :func:`merge`, :func:`length`,
:func:`intersect`, :func:`subtract`.

Example::

    >>> breakdown(window=[(0, 10)], compute=[(0, 4)], comm=[(2, 8)])
    {'total_time_us': 10.0, 'compute_time_us': 4.0, 'non_compute_time_us': 4.0, 'idle_time_us': 2.0, ...}
    >>> overlap_pct(comm=[(0, 10)], compute=[(5, 20)])   # half of the comm is covered
    50.0
    >>> waited(waits=[(6, 9)]), exposed(link=[(2, 8)], waits=[(6, 9)])   # waited 3, 2 of them for the link
    (3.0, 2.0)
"""

from __future__ import annotations

from typing import Iterable

Interval = tuple[float, float]


class Disjoint(list):
    """Sorted, disjoint intervals of floats, no two touching: what :func:`merge`, :func:`intersect`
    and :func:`subtract` return. :func:`merge` copies one as it is instead of sorting it again, so
    passing merged sets from step to step costs nothing more."""


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals (empty and reversed ones dropped)."""
    if isinstance(intervals, Disjoint):
        return Disjoint(intervals)  # merged already: merging again would give the same list
    out: list[list[float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)  # touches or overlaps the previous one: extend it
        else:
            out.append([start, end])
    return Disjoint((s, e) for s, e in out)


def length(intervals: Iterable[Interval]) -> float:
    """``|X|``: the time covered by at least one interval (nested ones counted once)."""
    return sum(e - s for s, e in merge(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """``a ∩ b`` as disjoint intervals (a two-pointer sweep over both unions)."""
    a, b = merge(a), merge(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        # advance whichever ends first: it cannot meet anything further on the other side
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return Disjoint(out)  # pieces of disjoint intervals, so disjoint (and no two touch) in turn


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """``a ∖ b``: the parts of ``a`` that ``b`` does not cover (a sweep over both unions).

    For each interval of ``a``, a cursor walks from its start over the ``b`` intervals that begin
    before its end, keeping the gaps between them. Both unions are sorted, so the ``b`` intervals
    that end before this ``a`` interval starts end before every later one starts too: ``first``
    skips them for good, and each ``b`` interval is looked at about once.
    """
    a, b = merge(a), merge(b)
    out, first = [], 0
    for start, end in a:
        while first < len(b) and b[first][1] <= start:
            first += 1  # ends before this interval (and so before all the next ones) starts
        cursor, j = start, first
        while j < len(b) and b[j][0] < end:
            bs, be = b[j]
            if be > cursor:
                if bs > cursor:
                    out.append((cursor, bs))  # the gap before this b interval
                cursor = max(cursor, be)
            j += 1
        if cursor < end:
            out.append((cursor, end))
    return Disjoint(out)  # gaps between disjoint intervals, within disjoint intervals


def _within(intervals: Iterable[Interval], window: Iterable[Interval] | None) -> list[Interval]:
    return merge(intervals) if window is None else intersect(intervals, window)


def in_flight(comm: Iterable[Interval], window: Iterable[Interval] | None = None) -> float:
    """Step 1, **in flight**: ``|comm ∩ window|``, the time communication was in flight (the whole of it without
    ``window``)."""
    return length(_within(comm, window))


def non_compute(window: Iterable[Interval], compute: Iterable[Interval], comm: Iterable[Interval]) -> float:
    """Step 2, **non-compute**: ``|(comm ∖ compute) ∩ window|``, communication in flight while nothing computes."""
    return length(subtract(_within(comm, window), compute))


def breakdown(window: Iterable[Interval], compute: Iterable[Interval], comm: Iterable[Interval]) -> dict:
    """The temporal breakdown of ``window`` into compute / non-compute (step 2) / idle, in time and in % of it."""
    window = merge(window)
    compute = intersect(compute, window)
    comm = intersect(comm, window)
    total = length(window)
    compute_t = length(compute)
    non_compute_t = non_compute(window, compute, comm)
    idle_t = total - length(compute + comm)

    def pct(x: float) -> float:
        return 100.0 * x / total if total > 0 else float("nan")

    return {
        "total_time_us": total,
        "compute_time_us": compute_t,
        "non_compute_time_us": non_compute_t,
        "idle_time_us": idle_t,
        "compute_pctg": pct(compute_t),
        "non_compute_pctg": pct(non_compute_t),
        "idle_pctg": pct(idle_t),
    }


def overlap_parts(
    comm: Iterable[Interval], compute: Iterable[Interval], window: Iterable[Interval] | None = None
) -> tuple[float, float]:
    """Step 3's two sums: ``(|comm ∩ compute ∩ window|, |comm ∩ window|)``, communication under compute and all of
    it. Kept apart so that several steps, ranks or rounds pool into one ratio (:func:`pooled_overlap_pct`)."""
    comm = _within(comm, window)
    return length(intersect(comm, compute)), length(comm)


def pooled_overlap_pct(parts: Iterable[tuple[float, float]]) -> float:
    """Step 3 over several :func:`overlap_parts`: all communication under compute over all of it, in %; 0 where
    nothing was in flight (HTA gives NaN there, which a table cannot compare)."""
    parts = list(parts)
    total = sum(c for _, c in parts)
    return 100.0 * sum(u for u, _ in parts) / total if total > 0 else 0.0


def overlap_pct(
    comm: Iterable[Interval], compute: Iterable[Interval], window: Iterable[Interval] | None = None
) -> float:
    """Step 3, **overlap**: the share (in %) of communication time during which compute also runs."""
    return pooled_overlap_pct([overlap_parts(comm, compute, window)])


def interleaved(comm: Iterable[Interval], compute: Iterable[Interval], backward: Iterable[Interval]) -> float:
    """Step 4, **interleaved**: ``|(comm ∖ compute) ∩ backward|``, the non-compute time inside backward."""
    return non_compute(backward, compute, comm)


def waited(waits: Iterable[Interval], window: Iterable[Interval] | None = None) -> float:
    """Step 5, **waited**: ``|waits ∩ window|``, the time the training thread stood still for communication."""
    return length(_within(waits, window))


def exposed(link: Iterable[Interval], waits: Iterable[Interval], window: Iterable[Interval] | None = None) -> float:
    """Step 6, **exposed**: ``|link ∩ waits ∩ window|``, the link's modeled transfers the training thread waited
    through (not the time a free link would save: module doc)."""
    return length(intersect(_within(link, window), waits))


def comm_cost(step: float, free_step: float) -> float:
    """Step 8, **comm cost**: ``step − free_step``, the step time sending adds: a stage's step against the same
    stage's with nothing sent (``noop_hook``), two runs' medians (``python -m minddp.bench``), in their unit."""
    return step - free_step


def link_time(link, messages: Iterable[tuple[str, float, int]]) -> float:
    """Step 7, **link time**, in seconds: each ``(kind, bytes, ranks)`` message's modeled transfer on ``link`` (a
    :class:`minddp.comm.link.LinkSpec` or :class:`~minddp.comm.link.Link`), added up: the link's own work."""
    return sum(link.seconds(kind, nbytes, ranks) for kind, nbytes, ranks in messages)
