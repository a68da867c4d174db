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
    """Per stage (rank 0): messages handed over (ticks), and how many during a backward."""
    b = rank0(result.buckets)
    rows = {
        st: {"handed over": int((b["stage"] == st).sum()), "during a backward": sent_in_backward(result, st)}
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
    """Save ``fig`` to ``path`` (100 dpi) and show it once, from the file; the hand-over ticks drawn under the
    message bars, so that dense ticks do not hide them."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    for line in (ln for ax in fig.axes for ln in ax.lines if ln.get_marker() == "|"):
        line.set_zorder(0.9)

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
    """The link run's messages, per stage (rank 0, one profiled step): how many were handed over, their bytes in
    all, how many during a backward (:func:`sent_in_backward`) and the stage's link time (:func:`link_ms`,
    unrounded)."""
    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    stages = rank0(linked.summary)["stage"]
    return pd.DataFrame(
        {
            "messages": sent.groupby("stage").size().reindex(stages).to_numpy(),
            "bytes": nbytes.groupby(sent["stage"]).sum().reindex(stages).to_numpy(),
            "during a backward": [sent_in_backward(linked, st) for st in stages],
            "link time (ms)": [link_ms(linked, link, st) for st in stages],
        },
        index=pd.Index(stages, name="stage"),
    )


def exposed_share(table: pd.DataFrame, blocking: list[str], asynchronous: list[str]) -> str:
    """A line to print: the most of the ``asynchronous`` stages' exposed, as a share of the link time, against the
    least of the ``blocking`` stages' (from ``table``'s printed columns, to 0.1 %, and whose), and whether each of
    the first is below each of the second; one profiled step each, not claimed.

    >>> t = pd.DataFrame({"link time (ms)": [10.0, 10.0], "exposed (ms)": [9.0, 1.0]}, index=["b", "a"])
    >>> print(exposed_share(t, ["b"], ["a"]))  # doctest: +NORMALIZE_WHITESPACE
    Exposed, as a share of the link time: 10.0 % at most in a (a's), 90.0 % at least in the blocking stages
    (b's): rank 0 waited through less of the link's work in each of a than in each blocking stage.
    """
    share = 100 * table["exposed (ms)"] / table["link time (ms)"]
    low, high = share[asynchronous], share[blocking]
    names = " and ".join(asynchronous)
    verdict = (
        f"rank 0 waited through less of the link's work in each of {names} than in each blocking stage"
        if low.max() < high.min()
        else f"not each of {names} below each blocking stage"
    )
    return (
        f"Exposed, as a share of the link time: {low.max():.1f} % at most in {names} ({low.idxmax()}'s), "
        f"{high.min():.1f} % at least in the blocking stages ({high.idxmin()}'s): {verdict}."
    )


def checks_order(shares: pd.DataFrame, messages: pd.Series, a: str, b: str) -> str:
    """A line to print: stages ``a`` and ``b``'s non-compute with and without its part in the parameter checks
    (``shares``' printed columns, ms), their message counts, and which of the two has more each way; one profiled
    step, not claimed.

    >>> t = pd.DataFrame({"non-compute (ms)": [40.0, 30.0], "of it, in the checks (ms)": [20.0, 1.0]}, index=["h", "b"])
    >>> print(checks_order(t, pd.Series({"h": 66, "b": 5}), "h", "b"))  # doctest: +NORMALIZE_WHITESPACE
    Non-compute, h (66 messages) against b (5): 40.0 against 30.0 ms; without its part in the checks, 20.0 against
    29.0 ms: h's is more with the checks, b's without: the part in the checks decides which is more here, and
    outside the checks the stage with fewer messages has more.
    """
    nc, chk = shares["non-compute (ms)"], shares["of it, in the checks (ms)"]
    out = (nc - chk).round(1)
    more_with = a if nc[a] > nc[b] else b
    more_without = a if out[a] > out[b] else b
    if more_with == more_without:
        verdict = f"{more_with}'s is more either way"
    else:
        verdict = (
            f"{more_with}'s is more with the checks, {more_without}'s without: the part in the checks decides which "
            "is more here"
        )
        fewer = a if messages[a] < messages[b] else b
        if messages[a] != messages[b] and more_without == fewer:
            verdict += ", and outside the checks the stage with fewer messages has more"
    return (
        f"Non-compute, {a} ({messages[a]} messages) against {b} ({messages[b]}): {nc[a]:.1f} against {nc[b]:.1f} ms; "
        f"without its part in the checks, {out[a]:.1f} against {out[b]:.1f} ms: {verdict}."
    )


def idle_share(table: pd.DataFrame, stage: str) -> str:
    """A line to print: the stage's waited − exposed (``table``'s printed columns) as a share of its waited, and
    whether any of its wait had rank 0's link carrying nothing; one profiled step, not claimed.

    >>> t = pd.DataFrame({"waited (ms)": [60.0], "waited − exposed (ms)": [20.0]}, index=["s"])
    >>> print(idle_share(t, "s"))  # doctest: +NORMALIZE_WHITESPACE
    s: waited − exposed is 20.0 of its 60.0 ms waited (33 %): for part of its wait rank 0's link carried nothing,
    so its wait was not all the link's.
    """
    w, r = table.loc[stage, "waited (ms)"], table.loc[stage, "waited − exposed (ms)"]
    if w <= 0:
        return f"{stage}: no wait."
    words = (
        "for part of its wait rank 0's link carried nothing, so its wait was not all the link's"
        if r > 0
        else "its link carried a transfer through all of its wait"
    )
    return f"{stage}: waited − exposed is {r:.1f} of its {w:.1f} ms waited ({100 * r / w:.0f} %): {words}."


def bucket_pairs(table: pd.DataFrame, pairs: list[tuple[str, str]]) -> str:
    """A line to print: for each (one message a parameter, buckets) pair of stages, waited, exposed and waited −
    exposed (``table``'s printed columns), and which of the last two changed more, in words (less or more of
    which kind of wait); one profiled step each, not claimed.

    >>> t = pd.DataFrame({"waited (ms)": [9.0, 5.0, 0.0, 6.0], "exposed (ms)": [4.0, 4.5, 0.0, 5.9]},
    ...                  index=["h", "b", "ha", "ba"])
    >>> t["waited − exposed (ms)"] = t["waited (ms)"] - t["exposed (ms)"]
    >>> print(bucket_pairs(t, [("h", "b"), ("ha", "ba")]))  # doctest: +NORMALIZE_WHITESPACE
    From one message a parameter to buckets, in this step: h → b, waited 9.0 → 5.0 ms (exposed 4.0 → 4.5, waited −
    exposed 5.0 → 0.5): with buckets, less waiting while rank 0's link carried nothing; ha → ba, waited 0.0 → 6.0
    ms (exposed 0.0 → 5.9, waited − exposed 0.0 → 0.1): with buckets, more waiting while rank 0's link carried a
    transfer.
    """
    w, e, r = "waited (ms)", "exposed (ms)", "waited − exposed (ms)"
    parts = []
    for a, b in pairs:
        de, dr = table.loc[b, e] - table.loc[a, e], table.loc[b, r] - table.loc[a, r]
        big, what = (dr, "nothing") if abs(dr) >= abs(de) else (de, "a transfer")
        words = (
            "no change"
            if big == 0
            else f"with buckets, {'less' if big < 0 else 'more'} waiting while rank 0's link carried {what}"
        )
        parts.append(
            f"{a} → {b}, waited {table.loc[a, w]:.1f} → {table.loc[b, w]:.1f} ms (exposed {table.loc[a, e]:.1f} → "
            f"{table.loc[b, e]:.1f}, waited − exposed {table.loc[a, r]:.1f} → {table.loc[b, r]:.1f}): {words}"
        )
    return f"From one message a parameter to buckets, in this step: {'; '.join(parts)}."
