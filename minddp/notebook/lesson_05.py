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


def shares(zero: pd.DataFrame, checked: pd.DataFrame) -> pd.DataFrame:
    """The loopback table: in flight (ms), the part of it in the step's parameter checks, all together (``checks``),
    overlap (%) and non-compute (ms), each to 0.1."""
    return (
        pd.DataFrame(
            {
                "in flight (ms)": zero["comm_time_per_step_us"] / 1e3,
                "checks (ms)": checked["check (ms)"].astype(float).reindex(zero.index),
                "overlap (%)": zero["comm_comp_overlap_pctg"],
                "non-compute (ms)": zero["non_compute_time_us"] / 1e3,
            }
        )
        .round(1)
        .rename_axis(None)
    )


def checks(run: Path, stages) -> pd.DataFrame:
    """Per stage (rank 0's profiled step): how long its parameter checks' all_gather ranges were open (``check
    (ms)``, their in flight) and the bytes each check gathers from a rank (``check bytes``, one list a stage;
    ``steps.bytes_of``)."""
    from minddp.analysis import metrics
    from minddp.analysis.steps import bytes_of

    rows = {}
    for stage in stages:
        iv, _, ranges = lesson.parameter_checks(run, stage)
        step = [iv.steps[-1][1:]]
        gathers = [e for e in iv.allgathers if step[0][0] <= e["ts"] <= step[0][1]]
        rows[stage] = {
            "check (ms)": metrics.in_flight(ranges, step) / 1e3,
            "check bytes": [bytes_of(e) for e in gathers],
        }
    return pd.DataFrame(rows).T


def tensors() -> int:
    """The model's trainable parameter tensors (``lesson.make_model``): a parameter check gathers one byte each."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tqdm's notice, on the model code's first import, that no widgets are here
        model = lesson.make_model()
    return sum(p.requires_grad for p in model.parameters())


def step_ms(result) -> pd.Series:
    """Rank 0's step length of each profiled stage, ms (the figure's step-end lines)."""
    p = rank0(result.phases)
    return p[p["phase"] == "step"].groupby("stage", sort=False)["end_us"].max() / 1e3


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
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for text in (t for legend in legends for t in legend.get_texts() if t.get_text() == "handed to the wire"):
        text.set_text("handed over")  # no wire in the loopback run

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
    """The link run's table (rank 0, one profiled step each): link time, waited, exposed and waited − exposed (ms, to
    0.1)."""
    stages = rank0(linked.summary)["stage"]
    waits = rank0(linked.per_step).groupby("stage")[["waited_us", "exposed_us"]].mean() / 1e3
    table = pd.DataFrame(
        {
            "link time (ms)": [link_ms(linked, link, st) for st in stages],
            "waited (ms)": waits["waited_us"].reindex(stages).to_numpy(),
            "exposed (ms)": waits["exposed_us"].reindex(stages).to_numpy(),
        },
        index=pd.Index(stages.to_numpy()),
    ).round(1)
    table["waited − exposed (ms)"] = (table["waited (ms)"] - table["exposed (ms)"]).round(1)  # of the rounded columns
    return table


def link_messages(linked, link) -> pd.DataFrame:
    """The link run's messages, per stage (rank 0, one profiled step): how many were handed over, their bytes in
    all and the stage's link time (:func:`link_ms`, unrounded)."""
    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    stages = rank0(linked.summary)["stage"]
    return pd.DataFrame(
        {
            "messages": sent.groupby("stage").size().reindex(stages).to_numpy(),
            "bytes": nbytes.groupby(sent["stage"]).sum().reindex(stages).to_numpy(),
            "link time (ms)": [link_ms(linked, link, st) for st in stages],
        },
        index=pd.Index(stages, name="stage"),
    )


def checks_as_built(checked: pd.DataFrame, accum: int, tensors: int) -> bool:
    """Whether rank 0's profiled steps hold ``accum`` parameter checks in ``simple`` (one a sync), one in ``ga`` to
    ``bucket-async``, none in ``ddp`` and torch's DDP, each gathering ``tensors`` bytes a rank (``checks``)."""
    runs = checked["check bytes"].map(len)
    return bool(
        runs["simple"] == accum
        and (runs[["ga", "hook", "hook-async", "bucket", "bucket-async"]] == 1).all()
        and (runs[["ddp", "torch"]] == 0).all()
        and all(b == tensors for sizes in checked["check bytes"] for b in sizes)
    )


def open_line(result, shares: pd.DataFrame, tensors: int) -> str:
    """In flight is how long ranges stay open: the checks column's range against the bytes a check gathers, and
    ``bucket``'s and ``bucket-async``'s messages (how many, whether the same sizes) against the rest of their in
    flight."""
    sizes = rank0(result.buckets).groupby("stage")["numel"].apply(sorted)
    count_b, count_ba = len(sizes["bucket"]), len(sizes["bucket-async"])
    count = f"{count_b} messages each" if count_b == count_ba else f"{count_b} and {count_ba} messages"
    same = "the same" if sizes["bucket"] == sizes["bucket-async"] else "not the same"
    held = shares["checks (ms)"].drop(["ddp", "torch"])  # the stages that run a check
    rest = shares["in flight (ms)"] - shares["checks (ms)"]
    return (
        f"In flight is how long ranges stay open (the caveat), not what their data takes: the checks, {tensors} bytes "
        f"each, {held.min():.1f} to {held.max():.1f} ms; bucket and bucket-async ({count}, {same} sizes), "
        f"{rest['bucket']:.1f} and {rest['bucket-async']:.1f} ms outside them."
    )


def fixed_costs(linked, link) -> tuple[bool, str]:
    """The claim that ``bucket-async`` sends fewer messages than ``hook-async``, the same bytes, and that its link
    time is shorter by their fixed costs alone, 2(n−1)·α a message with n ranks (to float rounding: 1e-9 of it)."""
    import math

    per = link_messages(linked, link)
    sends, ms, nbytes = per["messages"], per["link time (ms)"], per["bytes"]
    ranks = int(linked.summary["rank"].nunique())
    fewer, saved = sends["hook-async"] - sends["bucket-async"], ms["hook-async"] - ms["bucket-async"]
    fixed = 2 * (ranks - 1) * link.latency * 1e3  # 2(n−1)·α, ms
    holds = bool(
        fewer > 0
        and nbytes["hook-async"] == nbytes["bucket-async"]
        and math.isclose(saved, fewer * fixed, rel_tol=1e-9)
    )
    return holds, (
        f"bucket-async sends {fewer} fewer messages than hook-async, the same bytes: {saved:.1f} ms less link time "
        "(fixed costs)."
    )


def exposed_lines(linked, link, on_link: pd.DataFrame, blocking: list[str]) -> list[str]:
    """The link table read out: exposed as a share of link time, by kind of stage; and ``bucket-async``'s exposed
    against ``hook-async``'s, with the last message each hands over (its size and link time)."""
    from minddp.analysis import metrics

    exposed = on_link["exposed (ms)"]
    share = 100 * exposed / on_link["link time (ms)"]
    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    ranks = int(linked.summary["rank"].nunique())

    def last(stage: str) -> tuple[float, float]:  # the message handed over last (latest ready_us): bytes, link ms
        mine = sent["stage"] == stage
        b = nbytes[mine].loc[sent.loc[mine, "ready_us"].idxmax()]
        return b, 1e3 * metrics.link_time(link, [("all_reduce", b, ranks)])

    def size(b: float) -> str:
        return lesson.mib(b) if b >= 2**20 / 10 else f"{b / 2**10:.0f} KiB"

    (b_ba, t_ba), (b_ha, t_ha) = last("bucket-async"), last("hook-async")
    gap = exposed["bucket-async"] - exposed["hook-async"]
    than = f"{abs(gap):.1f} ms {'more' if gap > 0 else 'less'} than" if gap else "the same as"
    versus = "less than" if t_ba < exposed["bucket-async"] else "at least"
    return [
        f"Exposed is {share[blocking].min():.0f} to {share[blocking].max():.0f} % of link time in the blocking "
        f"stages, {share['hook-async']:.0f} % in hook-async and {share['bucket-async']:.0f} % in bucket-async, which "
        "wait for messages only in the finish.",
        f"bucket-async's exposed is {than} hook-async's; each one's last message leaves no earlier than backward's "
        f"last gradient: bucket-async's {size(b_ba)} ({t_ba:.1f} ms of link time, {versus} its "
        f"exposed), hook-async's {size(b_ha)} ({t_ha:.1f} ms).",
    ]
