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
    """A line to print: each of the ``asynchronous`` stages' exposed, as a share of the link time, against the least
    of the ``blocking`` stages' (from ``table``'s printed columns, to 0.1 %, and whose), and whether each of the first
    is below each of the second; one profiled step each, not claimed.

    >>> t = pd.DataFrame({"link time (ms)": [10.0, 10.0, 10.0], "exposed (ms)": [9.0, 1.0, 0.0]},
    ...                  index=["b", "a", "c"])
    >>> print(exposed_share(t, ["b"], ["a", "c"]))  # doctest: +NORMALIZE_WHITESPACE
    Exposed, as a share of the link time: 10.0 % in a, 0.0 % in c, 90.0 % at least in the blocking stages (b's):
    smaller in both than in each blocking stage.
    """
    share = 100 * table["exposed (ms)"] / table["link time (ms)"]
    low, high = share[asynchronous], share[blocking]
    names = "both" if len(asynchronous) == 2 else "each of " + " and ".join(asynchronous)
    verdict = (
        f"smaller in {names} than in each blocking stage"
        if low.max() < high.min()
        else f"not smaller in each of {' and '.join(asynchronous)} than in each blocking stage"
    )
    each = ", ".join(f"{low[st]:.1f} % in {st}" for st in asynchronous)
    return (
        f"Exposed, as a share of the link time: {each}, {high.min():.1f} % at least in the blocking stages "
        f"({high.idxmin()}'s): {verdict}."
    )


def backward_excess(result, stages, checks: dict) -> pd.DataFrame:
    """Per stage (rank 0's profiled step): its last backward band's length, how much longer it is than the longest of
    the step's earlier backward bands (which send nothing), how much those differ from each other (longest −
    shortest; 0 with one), and how long a parameter check's range (``checks``: stage -> (start, end) ms from the
    step's start, :func:`timeline_rows`) was open inside the last band, ms to 0.1. All from one step of one stage.

    >>> ph = pd.DataFrame({"rank": 0, "stage": "h", "phase": "backward", "start_us": [400e3, 0.0, 200e3],
    ...                    "end_us": [700e3, 100e3, 310e3]})
    >>> t = backward_excess(type("R", (), {"phases": ph}), ["h"], {"h": [(350.0, 450.0)]})
    >>> print(t.to_string())  # doctest: +NORMALIZE_WHITESPACE
       last (ms)  over longest earlier (ms)  earlier differ by (ms)  check in it (ms)
    h      300.0                      190.0                    10.0              50.0
    """
    p = rank0(result.phases)
    rows = {}
    for st in stages:
        back = p[(p["stage"] == st) & (p["phase"] == "backward")].sort_values("start_us")
        ms = ((back["end_us"] - back["start_us"]) / 1e3).to_numpy()
        b0, b1 = back["start_us"].iloc[-1] / 1e3, back["end_us"].iloc[-1] / 1e3
        rows[st] = {
            "last (ms)": ms[-1],
            "over longest earlier (ms)": ms[-1] - ms[:-1].max(),
            "earlier differ by (ms)": ms[:-1].max() - ms[:-1].min(),
            "check in it (ms)": sum(max(0.0, min(b, b1) - max(a, b0)) for a, b in checks.get(st, [])),
        }
    return pd.DataFrame(rows).T.round(1)


def excess_line(table: pd.DataFrame) -> str:
    """A line to print (``table``: :func:`backward_excess`'s printed columns): in which stages the last backward band,
    less the check's range in it, is longer than the longest earlier one by more than the earlier ones differ from
    each other; one profiled step, not claimed.

    >>> t = pd.DataFrame({"over longest earlier (ms)": [190.0, 5.0, 30.0], "earlier differ by (ms)":
    ...                   [10.0, 8.0, 2.0], "check in it (ms)": [0.0, 0.0, 29.0]}, index=["h", "b", "d"])
    >>> print(excess_line(t))  # doctest: +NORMALIZE_WHITESPACE
    Less the check's range in it, the last backward outlasts the longest earlier one by more than the earlier ones
    differ from each other in h; not in b and d.
    """
    more = table["over longest earlier (ms)"] - table["check in it (ms)"] > table["earlier differ by (ms)"]

    def names(sts):
        return ", ".join(sts[:-1]) + f" and {sts[-1]}" if len(sts) > 1 else sts[0]

    yes, no = list(table.index[more]), list(table.index[~more])
    said = f"in {names(yes)}" if yes else "in no stage"
    return (
        "Less the check's range in it, the last backward outlasts the longest earlier one by more than the earlier "
        f"ones differ from each other {said}" + (f"; not in {names(no)}." if yes and no else ".")
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


def not_drawn(parts: dict) -> str:
    """A line to print (``parts``: stage -> :func:`in_flight_parts`): the gloo ranges in flight that are neither an
    all_reduce nor a check, in which stages, and the most time in flight outside every all_reduce and check range of
    a stage; empty where there are none.

    >>> print(not_drawn({"b": (9.0, 0.0, []), "d": (11.0, 1.04, ["gloo:broadcast"])}))  # doctest: +NORMALIZE_WHITESPACE
    Also in the table's in flight: gloo:broadcast ranges (the model's buffers, broadcast in a forward) in d; they
    add at most 1.0 ms to a stage's in flight.
    """

    def names(stages):
        return ", ".join(stages[:-1]) + f" and {stages[-1]}" if len(stages) > 1 else stages[0]

    other: dict[str, list[str]] = {}
    for st in parts:
        for n in parts[st][2]:
            other.setdefault(n, []).append(st)
    what = "; ".join(
        f"{n} ranges ({NOT_DRAWN[n]}) in {names(sts)}" if n in NOT_DRAWN else f"{n} ranges in {names(sts)}"
        for n, sts in other.items()
    )
    most = max(parts[st][1] for st in parts)
    add = f"at most {most:.1f} ms" if round(most, 1) > 0 else "under 0.1 ms"
    return f"Also in the table's in flight: {what}; they add {add} to a stage's in flight." if other else ""


def overlap_order(ov: pd.Series, blocking: list[str], asynchronous: list[str]) -> str:
    """A line to print: the range of the ``asynchronous`` and of the ``blocking`` stages' overlaps (``ov``, %), and in
    words whether each of the first is above each of the second; one profiled step, not claimed.

    >>> print(overlap_order(pd.Series({"b": 5.0, "a": 60.0}), ["b"], ["a"]))  # doctest: +NORMALIZE_WHITESPACE
    Overlap: 60.0–60.0 % in the asynchronous stages, 5.0–5.0 % in the blocking ones: each asynchronous stage's is
    above each blocking stage's.
    """
    lo, hi = ov[blocking].max(), ov[asynchronous]
    line = (
        f"Overlap: {hi.min():.1f}–{hi.max():.1f} % in the asynchronous stages, {ov[blocking].min():.1f}–{lo:.1f} % "
        "in the blocking ones"
    )
    below = [st for st in asynchronous if hi[st] <= lo]
    if below:
        return (
            f"{line}; {', '.join(below)} no higher than {ov[blocking].idxmax()}'s {lo:.1f} %: in this step, not "
            "each asynchronous stage gave compute more of its time in flight than each blocking one."
        )
    return f"{line}: each asynchronous stage's is above each blocking stage's."


def link_after_backward(linked, link, run: Path, stages) -> str:
    """A line to print (``run``: the link run's folder; ``stages``: ones whose first ``wait()`` is in the finish): for
    each, how long rank 0's link still carried transfers after the last backward band ended (``metrics.in_flight``
    of the link's transfers after it: an upper bound on exposed, whose waits all come later), and the least it could
    have: the link carries messages one at a time, each from its hand-over on, so the messages handed over from L ms
    before that end on, whose link time is T, leave at least T − L ms of transfers after it; the largest such T − L
    over the step's messages, with its T and L; one step, not claimed."""
    from minddp.analysis import metrics
    from minddp.analysis.cpu import rank_intervals
    from minddp.analysis.events import load_stage

    p, sent, nbytes = rank0(linked.phases), rank0(linked.buckets), message_bytes(linked)
    world = int(linked.summary["rank"].nunique())
    after, bound = {}, {}
    for st in stages:
        iv = rank_intervals(load_stage(Path(run) / st).ranks[0])
        _, s0, s1 = iv.steps[-1]
        end = p[(p["stage"] == st) & (p["phase"] == "backward")].sort_values("start_us").iloc[-1]["end_us"]
        after[st] = metrics.in_flight(iv.link, [(s0 + end, s1)]) / 1e3
        mine = sent[sent["stage"] == st].sort_values("ready_us")
        left = [1e3 * link.seconds("all_reduce", b, world) for b in nbytes[mine.index]]
        leads = [max(0.0, (end - r) / 1e3) for r in mine["ready_us"]]
        tails = [(sum(left[i:]) - leads[i], sum(left[i:]), leads[i]) for i in range(len(left))]
        worst = max(tails)
        bound[st] = (round(worst[1], 1) - round(worst[2], 1), worst[1], worst[2])  # as printed: T − L of T and L
    shown = [st for st in stages if bound[st][0] > 0]

    def each(values, names):
        return " and ".join(f"{values(st):.1f}" for st in names)

    line = (
        "From the last backward's end to the step's end (exposed is part of it), rank 0's link carried transfers for "
    )
    line += " and ".join(f"{after[st]:.1f} ms in {st}" for st in stages)
    if shown:
        where = "" if shown == list(stages) else f" in {' and '.join(shown)}"
        line += (
            f"; the messages handed over in the backward's last {each(lambda st: bound[st][2], shown)} ms{where} take "
            f"{each(lambda st: bound[st][1], shown)} ms of link time, so at least "
            f"{each(lambda st: bound[st][0], shown)} ms of it is left after the backward"
        )
    return line + "."
