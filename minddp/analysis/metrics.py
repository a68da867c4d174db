"""The metric definitions, on plain time intervals, shared by the CPU and GPU paths.

A trace reduces to three sets of ``(start, end)`` intervals per rank, in microseconds: the
**window** under study, **compute** and **comm** (docs/analysis.md, "The three interval sets", says
what each is on CPU and on GPU). With ``|X|`` the length of the union of the intervals of ``X``:

1. ``compute_time = |compute ∩ window|``;
2. ``non_compute_time = |(comm ∖ compute) ∩ window|`` (busy, but not computing);
3. ``idle_time = |window| - |(compute ∪ comm) ∩ window|``; the three add up to ``|window|``;
4. ``comm_comp_overlap_pctg = 100 · |comm ∩ compute| / |comm|`` (0 when there is no comm).

These are HolisticTraceAnalysis's definitions, written on intervals so they apply where HTA cannot go.

Example::

    >>> breakdown(window=[(0, 10)], compute=[(0, 4)], comm=[(2, 8)])
    {'total_time_us': 10.0, 'compute_time_us': 4.0, 'non_compute_time_us': 4.0, 'idle_time_us': 2.0, ...}
    >>> overlap_pct(comm=[(0, 10)], compute=[(5, 20)])   # half of the comm is covered
    50.0
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


def breakdown(window: Iterable[Interval], compute: Iterable[Interval], comm: Iterable[Interval]) -> dict:
    """Steps 1-3: the temporal breakdown of ``window`` into compute / non-compute / idle."""
    window = merge(window)
    compute = intersect(compute, window)
    comm = intersect(comm, window)
    total = length(window)
    compute_t = length(compute)  # step 1
    non_compute_t = length(subtract(comm, compute))  # step 2
    idle_t = total - length(compute + comm)  # step 3

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


def overlap_pct(comm: Iterable[Interval], compute: Iterable[Interval]) -> float:
    """Step 4: the share (in %) of communication time during which compute also runs."""
    comm = merge(comm)
    total = length(comm)
    if total == 0:
        return 0.0  # nothing to hide; HTA gives NaN here, which a table cannot compare
    return 100.0 * length(intersect(comm, compute)) / total
