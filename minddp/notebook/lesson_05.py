"""The plumbing of ``notebooks/05_reading_traces``: its tables, its figure's rows and its printed lines.

Each function reads rank 0's profiled step from a :class:`minddp.analysis.RunAnalysis` (or the run folder) and
returns a table or lines to print, so that a cell of the notebook shows its point in a few lines. No measure is
defined here: in flight, overlap and non-compute come from the analysis' summary, link time, waited and exposed
from :mod:`minddp.analysis.metrics` (``docs/analysis.md``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minddp.notebook import lesson


def rank0(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of rank 0 of one of ``RunAnalysis``' frames (``summary``, ``buckets``, ``phases``, ``per_step``)."""
    return frame[frame["rank"] == 0]


def summary(result) -> pd.DataFrame:
    """Rank 0's summary row of each profiled stage but ``single`` (which sends nothing), indexed by stage."""
    zero = rank0(result.summary)
    return zero[zero["stage"] != "single"].set_index("stage")


def shares(zero: pd.DataFrame, run: Path) -> pd.DataFrame:
    """The loopback table: in flight (ms), overlap (%), non-compute (ms) and the part of it inside the parameter
    checks (:func:`lesson.non_compute_in_checks`), each to 0.1."""
    return pd.DataFrame(
        {
            "in flight (ms)": zero["comm_time_per_step_us"] / 1e3,
            "overlap (%)": zero["comm_comp_overlap_pctg"],
            "non-compute (ms)": zero["non_compute_time_us"] / 1e3,
            "of it, in the checks (ms)": pd.Series({st: lesson.non_compute_in_checks(run, st) for st in zero.index})
            / 1e3,
        }
    ).round(1)


def sent_in_backward(result, stage: str) -> int:
    """How many of the stage's messages (rank 0's ``buckets`` rows) were handed over during one of its
    backward bands (``phases``)."""
    p, b = rank0(result.phases), rank0(result.buckets)
    backward = p[(p["stage"] == stage) & (p["phase"] == "backward")]
    ready = b.loc[b["stage"] == stage, "ready_us"]
    return int(sum(((backward["start_us"] <= t) & (t <= backward["end_us"])).any() for t in ready))


def anatomy(result, stages) -> pd.DataFrame:
    """Per stage (rank 0): messages sent (ticks), and how many during a backward."""
    b = rank0(result.buckets)
    rows = {
        st: {"messages sent": int((b["stage"] == st).sum()), "sent during a backward": sent_in_backward(result, st)}
        for st in stages
    }
    return pd.DataFrame(rows).T.astype(int)


def timeline_rows(result, run: Path) -> list[dict]:
    """The rows :func:`minddp.analysis.timeline.draw_steps` draws (``rows_from_analysis``), each with its stage's
    parameter checks (``checks``: gloo's all_gather ranges, ms from the step's start, so ``checks_in_flight``)."""
    from minddp.analysis.timeline import rows_from_analysis

    rows = rows_from_analysis(result)
    for row in rows:
        _, s0, checks = lesson.parameter_checks(run, row["stage"])
        row["checks"] = [((a - s0) / 1e3, (b - s0) / 1e3) for a, b in checks]
        row["checks_in_flight"] = True
    return rows


def show(fig, path: Path) -> None:
    """Save ``fig`` to ``path`` (100 dpi) and show it once, from the file."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    fig.savefig(path, dpi=100)
    plt.close(fig)
    display(Image(filename=path))


def phase_ms(result, phase: str) -> pd.Series:
    """Each profiled stage's time in ``phase`` (its spans added up; rank 0's step), ms; ``single`` included."""
    p = rank0(result.phases)
    part = p[p["phase"] == phase]
    return (part["end_us"] - part["start_us"]).groupby(part["stage"]).sum() / 1e3


def bands_ms(result, phase: str) -> pd.DataFrame:
    """Each profiled stage's spans of ``phase`` (rank 0's step), ms, one column per span in the order they began."""
    p = rank0(result.phases)
    part = p[p["phase"] == phase].sort_values("start_us")
    ms = (part["end_us"] - part["start_us"]) / 1e3
    return pd.DataFrame({st: ms[part["stage"] == st].to_list() for st in p["stage"].unique()}).T


def spread(ms: pd.Series) -> str:
    """The least and the most of ``ms`` over the stages (to the ms), whose, and the ratio of those two printed
    values.

    >>> spread(pd.Series({"a": 20.4, "b": 95.2}))
    "20–95 ms (a's to b's, 4.8 ×)"
    """
    lo, hi = round(ms.min()), round(ms.max())
    return f"{lo}–{hi} ms ({ms.idxmin()}'s to {ms.idxmax()}'s, {hi / lo:.1f} ×)"


def below(measure: str, low: pd.Series, high: pd.Series, unit: str, low_name: str, high_name: str) -> str:
    """A line to print: whether every value of ``low`` is below every value of ``high`` (the most of ``low`` against
    the least of ``high``, to 0.1, and whose), of ``measure`` in ``unit``; one profiled step each, so not claimed.

    >>> print(below("Overlap", pd.Series({"a": 1.0, "b": 7.3}), pd.Series({"c": 70.8}), "%", "low", "high"))
    Overlap: every low stage's is below every high stage's (7.3 % at most, b's, against 70.8 % at least, c's).
    """
    every = "every" if low.max() < high.min() else "not every"
    return (
        f"{measure}: {every} {low_name} stage's is below every {high_name} stage's ({low.max():.1f} {unit} at most, "
        f"{low.idxmax()}'s, against {high.min():.1f} {unit} at least, {high.idxmin()}'s)."
    )


def message_bytes(linked) -> pd.Series:
    """Rank 0's messages of the link run (``buckets`` rows), each one's bytes (float32: 4 a number)."""
    sent = rank0(linked.buckets)
    assert (sent["dtype"] == "float32").all()
    return sent["numel"] * 4


def link_ms(linked, link, stage: str) -> float:
    """The stage's *link time* (``metrics.link_time``): each all_reduce of rank 0's step modeled on ``link``, ms."""
    from minddp.analysis import metrics

    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    world = int(linked.summary["rank"].nunique())
    return 1e3 * metrics.link_time(link, [("all_reduce", b, world) for b in nbytes[sent["stage"] == stage]])


def link_table(linked, link) -> pd.DataFrame:
    """The link run's table (rank 0, one profiled step each): link time, waited, exposed (ms, to 0.1), and waited −
    exposed, the difference of the two printed columns."""
    stages = rank0(linked.summary)["stage"]
    waits = rank0(linked.per_step).groupby("stage")[["waited_us", "exposed_us"]].mean() / 1e3
    table = pd.DataFrame(
        {
            "link time (ms)": [link_ms(linked, link, st) for st in stages],
            "waited (ms)": waits["waited_us"].reindex(stages).to_numpy(),
            "exposed (ms)": waits["exposed_us"].reindex(stages).to_numpy(),
        },
        index=pd.Index(stages, name="stage"),
    ).round(1)
    table["waited − exposed (ms)"] = (table["waited (ms)"] - table["exposed (ms)"]).round(1)
    return table


def link_messages(linked, link) -> pd.DataFrame:
    """The link run's messages, per stage (rank 0, one profiled step): how many were sent, their bytes in all, how
    many were handed over during a backward (:func:`sent_in_backward`) and the stage's link time (:func:`link_ms`,
    unrounded)."""
    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    stages = rank0(linked.summary)["stage"]
    return pd.DataFrame(
        {
            "messages": sent.groupby("stage").size().reindex(stages).to_numpy(),
            "bytes": nbytes.groupby(sent["stage"]).sum().reindex(stages).to_numpy(),
            "sent during a backward": [sent_in_backward(linked, st) for st in stages],
            "link time (ms)": [link_ms(linked, link, st) for st in stages],
        },
        index=pd.Index(stages, name="stage"),
    )


def _last(linked, link, stage: str) -> tuple[float, float, float]:
    """Rank 0's last message of ``stage``: its MiB, its link time and how long before the end of the stage's last
    backward it was handed over (its ``ready_us``), ms."""
    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    mine = sent[sent["stage"] == stage].sort_values("ready_us")
    phases = rank0(linked.phases)
    end = phases.loc[(phases["stage"] == stage) & (phases["phase"] == "backward"), "end_us"].max()
    world = int(linked.summary["rank"].nunique())
    last = mine.index[-1]
    took = 1e3 * link.seconds("all_reduce", nbytes[last], world)
    return nbytes[last] / 2**20, took, (end - mine.loc[last, "ready_us"]) / 1e3


def last_messages(linked, link, table: pd.DataFrame, one: str = "bucket-async", other: str = "hook-async") -> str:
    """A line to print: ``one``'s exposed against ``other``'s (as printed in ``table``), then each one's last
    message: its MiB, its link time, how long before the end of the stage's last backward it was handed over, and
    the link's work left at that end, from those two printed values: at least their difference (a transfer starts
    no earlier than its hand-over), so "about" it "or more". Both stages call ``wait()`` only in the finish, after
    the last backward, so only work left then can be exposed. One profiled step, not claimed.

    >>> from types import SimpleNamespace
    >>> from minddp.comm.link import parse_link
    >>> b = pd.DataFrame({"stage": ["s", "s", "t"], "rank": 0, "numel": [2**20, 2**18, 2**16],
    ...                   "ready_us": [0.0, 9e3, 9.5e3], "dtype": "float32"})
    >>> p = pd.DataFrame({"stage": ["s", "t"], "rank": 0, "phase": "backward", "start_us": 0.0, "end_us": 10e3})
    >>> run = SimpleNamespace(buckets=b, phases=p, summary=pd.DataFrame({"rank": [0, 1]}))
    >>> t = pd.DataFrame({"exposed (ms)": [2.0, 0.5]}, index=["s", "t"])
    >>> print(last_messages(run, parse_link("1gbit"), t, "s", "t"))  # doctest: +NORMALIZE_WHITESPACE
    In one profiled step each, s's exposed is higher than t's (2.0 against 0.5 ms). Both call wait() only in the
    finish, after the last backward, so only the link's work left after it can be exposed: s's last message (1.000
    MiB, 8.5 ms on the link) was handed over 1.0 ms before its last backward ended, leaving the link about 7.5 ms of
    work or more; t's (0.250 MiB, 2.2 ms), 0.5 ms before, about 1.7 ms or more.
    """
    a, b = table.loc[one, "exposed (ms)"], table.loc[other, "exposed (ms)"]
    than = "higher than" if a > b else "lower than" if a < b else "the same as"
    parts = []
    for stage in (one, other):
        mib, took, before = _last(linked, link, stage)
        left = max(0.0, round(took, 1) - round(before, 1))
        parts.append((mib, took, before, left))
    (m1, t1, b1, l1), (m2, t2, b2, l2) = parts
    return (
        f"In one profiled step each, {one}'s exposed is {than} {other}'s ({a:.1f} against {b:.1f} ms). Both call "
        f"wait() only in the finish, after the last backward, so only the link's work left after it can be exposed: "
        f"{one}'s last message "
        f"({m1:.3f} MiB, {t1:.1f} ms on the link) was handed over {b1:.1f} ms before its last backward ended, leaving "
        f"the link about {l1:.1f} ms of work or more; {other}'s ({m2:.3f} MiB, {t2:.1f} ms), {b2:.1f} ms before, "
        f"about {l2:.1f} ms or more."
    )


def exposed_share(table: pd.DataFrame, sends: pd.Series, blocking: list[str], asynchronous: list[str]) -> str:
    """A line to print: whether each ``asynchronous`` stage's exposed, as a share of its link time, is below every
    ``blocking`` stage's (the most against the least, to 0.1 %, and whose), and the rest of a blocking stage's link
    time a message (from ``table``'s printed columns and ``sends``, to 0.1 ms); one profiled step each, not claimed.

    >>> t = pd.DataFrame({"link time (ms)": [10.0, 10.0], "exposed (ms)": [9.0, 1.0]}, index=["b", "a"])
    >>> print(exposed_share(t, pd.Series({"b": 2, "a": 2}), ["b"], ["a"]))  # doctest: +NORMALIZE_WHITESPACE
    Exposed, as a share of the link time: a's below every blocking stage's (10.0 % at most, a's, against 90.0 % at
    least, b's); the rest of a blocking stage's link time, 0.5 ms a message, is the link's work between a
    message's hand-over and the first wait() on it.
    """
    share = 100 * table["exposed (ms)"] / table["link time (ms)"]
    low, high = share[asynchronous], share[blocking]
    each = "below" if low.max() < high.min() else "not each below"
    rest = ((table["link time (ms)"] - table["exposed (ms)"]) / sends)[blocking]
    lo, hi = f"{rest.min():.1f}", f"{rest.max():.1f}"
    names = " and ".join(f"{st}'s" for st in asynchronous)
    return (
        f"Exposed, as a share of the link time: {names} {each} every "
        f"blocking stage's ({low.max():.1f} % at most, {low.idxmax()}'s, against {high.min():.1f} % at least, "
        f"{high.idxmin()}'s); the rest of a blocking stage's link time, {lo if lo == hi else f'{lo}–{hi}'} ms a "
        "message, is the link's work between a message's hand-over and the first wait() on it."
    )


def whose_waits(table: pd.DataFrame) -> str:
    """A line to print: the stages in more than half of whose waits rank 0's link carried nothing (waited − exposed,
    as printed in ``table``), each with that part; then what can hold any wait while the link carries nothing.

    >>> t = pd.DataFrame({"waited (ms)": [10.0, 8.0], "exposed (ms)": [9.0, 0.2]}, index=["a", "b"])
    >>> t["waited − exposed (ms)"] = t["waited (ms)"] - t["exposed (ms)"]
    >>> print(whose_waits(t))  # doctest: +NORMALIZE_WHITESPACE
    Rank 0's link carried nothing in more than half of the waits of: b (7.8 of 8.0 ms). In any wait in which it
    carries nothing, a real all_reduce has not ended (held by the other rank, or a core) or the link's thread has
    no core; the trace does not say which.
    """
    idle = table["waited − exposed (ms)"]
    over = [st for st in table.index if idle[st] > table.loc[st, "waited (ms)"] / 2]
    parts = ", ".join(f"{st} ({idle[st]:.1f} of {table.loc[st, 'waited (ms)']:.1f} ms)" for st in over) or "none"
    return (
        f"Rank 0's link carried nothing in more than half of the waits of: {parts}. In any wait in which it carries "
        "nothing, a real all_reduce has not ended (held by the other rank, or a core) or the link's thread has no "
        "core; the trace does not say which."
    )
