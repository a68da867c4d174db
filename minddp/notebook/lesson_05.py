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


def in_flight_parts(run: Path, stage: str) -> tuple[float, float, list[str]]:
    """Rank 0's profiled step of ``stage``: its time in flight (ms) inside its gloo all_reduce ranges (the plot's
    bars), the time in flight outside every all_reduce and all_gather range (ms), and the names of the gloo ranges of
    the step that are neither (the collectives the plot does not draw, such as a broadcast)."""
    from minddp.analysis import metrics
    from minddp.analysis.cpu import families, rank_intervals
    from minddp.analysis.events import load_stage
    from minddp.analysis.steps import end_of

    trace = load_stage(Path(run) / stage).ranks[0]
    iv = rank_intervals(trace)
    _, s0, s1 = iv.steps[-1]
    reduces = [(e["ts"], end_of(e)) for e in iv.allreduces]
    drawn_or_checks = reduces + [(e["ts"], end_of(e)) for e in iv.allgathers]
    other = metrics.in_flight(iv.comm, [(s0, s1)]) - metrics.in_flight(drawn_or_checks, [(s0, s1)])
    names = {
        e["name"].split("(")[0]
        for e in families(trace)["comm"]
        if s0 <= e["ts"] <= s1 and not e["name"].startswith(("gloo:all_reduce", "gloo:all_gather"))
    }
    return metrics.in_flight(reduces, [(s0, s1)]) / 1e3, other / 1e3, sorted(names)


#: What the collectives the plot does not draw carry, by gloo's range name (``minddp.ddp.DistributedDataParallel``
#: broadcasts its buffers in the forward after a sync, as torch's DDP does).
NOT_DRAWN = {"gloo:broadcast": "the model's buffers, broadcast in a forward"}


def held_open(shares: pd.DataFrame, sizes: pd.Series, parts: dict, a: str, b: str) -> str:
    """A line to print: stages ``a`` and ``b``'s time in flight (``shares``' printed columns), split into their
    messages' all_reduce ranges and other collectives (``parts``: stage -> :func:`in_flight_parts`), and, where both
    send the same messages (``sizes``: stage -> sorted message sizes), how much longer the one's ranges were open
    than the other's for the same bytes, as a share of its in flight; one profiled step, not claimed.

    >>> t = pd.DataFrame({"in flight (ms)": [100.0, 20.0], "overlap (%)": [80.0, 20.0]}, index=["d", "t"])
    >>> sizes = pd.Series({"d": [1, 2], "t": [1, 2]})
    >>> print(held_open(t, sizes, {"d": (90.0, 10.0, ["gloo:broadcast"]), "t": (18.0, 2.0, ["gloo:broadcast"])},
    ...                 "d", "t"))  # doctest: +NORMALIZE_WHITESPACE
    d and t hand over the same 2 messages (the same sizes). Of d's 100.0 ms in flight, 90.0 are in its messages'
    all_reduce ranges (the plot's bars) and 10.0 in gloo:broadcast ranges (the model's buffers, broadcast in a
    forward), not drawn; of t's 20.0 ms, 18.0 and 2.0. For the same bytes d's ranges were open 72.0 ms longer than
    t's, 72 % of d's in flight: time held open (the caveat), so d's overlap (80.0 %) is a share of time mostly held
    open.
    """
    names = sorted(set(parts[a][2]) | set(parts[b][2]))
    what = ", ".join(f"{n} ranges ({NOT_DRAWN[n]})" if n in NOT_DRAWN else f"{n} ranges" for n in names)
    ms = {st: (shares.loc[st, "in flight (ms)"], round(parts[st][0], 1), round(parts[st][1], 1)) for st in (a, b)}
    same = list(sizes[a]) == list(sizes[b])
    head = (
        f"{a} and {b} hand over the same {len(sizes[a])} messages (the same sizes)"
        if same
        else f"{a} and {b} hand over {len(sizes[a])} and {len(sizes[b])} messages, not of the same sizes"
    )
    line = (
        f"{head}. Of {a}'s {ms[a][0]:.1f} ms in flight, {ms[a][1]:.1f} are in its messages' all_reduce ranges (the "
        f"plot's bars) and {ms[a][2]:.1f} in {what or 'other collectives'}, not drawn; of {b}'s {ms[b][0]:.1f} ms, "
        f"{ms[b][1]:.1f} and {ms[b][2]:.1f}."
    )
    if not same or ms[a][1] == ms[b][1]:
        return line
    hi, lo = (a, b) if ms[a][1] > ms[b][1] else (b, a)
    longer = ms[hi][1] - ms[lo][1]
    share = 100 * longer / ms[hi][0]
    how = "mostly" if share > 50 else "partly"
    return (
        f"{line} For the same bytes {hi}'s ranges were open {longer:.1f} ms longer than {lo}'s, {share:.0f} % of "
        f"{hi}'s in flight: time held open (the caveat), so {hi}'s overlap ({shares.loc[hi, 'overlap (%)']:.1f} %) is "
        f"a share of time {how} held open."
    )


def idle_shares(table: pd.DataFrame) -> str:
    """A line to print: waited − exposed as a share of waited (``table``'s printed columns), the least and the most
    over the stages and whose, each said in words; one profiled step each, not claimed.

    >>> t = pd.DataFrame({"waited (ms)": [60.0, 40.0, 50.0], "waited − exposed (ms)": [20.0, 40.0, 0.0]},
    ...                  index=["s", "h", "b"])
    >>> print(idle_shares(t))  # doctest: +NORMALIZE_WHITESPACE
    Waited − exposed as a share of waited: from 0 % (b's) to 100 % (h's). In h rank 0's link carried no transfer
    at any moment of its wait: none of it was its work. In b rank 0's link carried a transfer through all of
    its wait.
    """
    waited = table["waited (ms)"]
    share = (100 * table["waited − exposed (ms)"] / waited)[waited > 0]
    lo, hi = share.idxmin(), share.idxmax()

    def words(st):
        r, w = table.loc[st, "waited − exposed (ms)"], table.loc[st, "waited (ms)"]
        if r >= w:
            return f"In {st} rank 0's link carried no transfer at any moment of its wait: none of it was its work."
        if r <= 0:
            return f"In {st} rank 0's link carried a transfer through all of its wait."
        if 2 * r < w:
            return f"In {st} rank 0's link carried a transfer through all but {r:.1f} ms of its {w:.1f} ms wait."
        return f"In {st} rank 0's link carried nothing for {r:.1f} of its {w:.1f} ms wait."

    return (
        f"Waited − exposed as a share of waited: from {share[lo]:.0f} % ({lo}'s) to {share[hi]:.0f} % ({hi}'s). "
        f"{words(hi)} {words(lo)}"
    )


def bucket_pairs(table: pd.DataFrame, pairs: list[tuple[str, str]]) -> str:
    """A line to print: for each (one message a parameter, buckets) pair of stages, waited, exposed and waited −
    exposed (``table``'s printed columns), and in words how much each kind of wait changed, and waited in all; one
    profiled step each, not claimed.

    >>> t = pd.DataFrame({"waited (ms)": [9.0, 5.0, 4.0, 6.0], "exposed (ms)": [4.0, 4.0, 0.0, 5.9]},
    ...                  index=["h", "b", "ha", "ba"])
    >>> t["waited − exposed (ms)"] = t["waited (ms)"] - t["exposed (ms)"]
    >>> print(bucket_pairs(t, [("h", "b"), ("ha", "ba")]))  # doctest: +NORMALIZE_WHITESPACE
    From one message a parameter to buckets, in this step: h → b, waited 9.0 → 5.0 ms, exposed 4.0 → 4.0, waited −
    exposed 5.0 → 1.0: with buckets rank 0 waited 4.0 ms less while its link carried nothing and as long while it
    carried a transfer, 4.0 ms less in all. ha → ba, waited 4.0 → 6.0 ms, exposed 0.0 → 5.9, waited − exposed 4.0 →
    0.1: with buckets rank 0 waited 3.9 ms less while its link carried nothing and 5.9 ms more while it carried a
    transfer, 2.0 ms more in all.
    """
    w, e, r = "waited (ms)", "exposed (ms)", "waited − exposed (ms)"

    def change(x, y):
        d = round(y - x, 1)
        return "as long" if d == 0 else f"{abs(d):.1f} ms {'less' if d < 0 else 'more'}"

    parts = []
    for a, b in pairs:
        (wa, ea, ra), (wb, eb, rb) = (table.loc[st, [w, e, r]] for st in (a, b))
        total = "as long in all" if round(wb - wa, 1) == 0 else f"{change(wa, wb)} in all"
        parts.append(
            f"{a} → {b}, waited {wa:.1f} → {wb:.1f} ms, exposed {ea:.1f} → {eb:.1f}, waited − exposed {ra:.1f} → "
            f"{rb:.1f}: with buckets rank 0 waited {change(ra, rb)} while its link carried nothing and "
            f"{change(ea, eb)} while it carried a transfer, {total}"
        )
    return f"From one message a parameter to buckets, in this step: {'. '.join(parts)}."
