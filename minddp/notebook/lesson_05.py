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
    """A line to print: each of the ``asynchronous`` stages' exposed, as a share of the link time, against the least
    of the ``blocking`` stages' (from ``table``'s printed columns, to 0.1 %, and whose), and whether each of the first
    is below each of the second; one profiled step each, not claimed.

    >>> t = pd.DataFrame({"link time (ms)": [10.0, 10.0, 10.0], "exposed (ms)": [9.0, 1.0, 0.0]},
    ...                  index=["b", "a", "c"])
    >>> print(exposed_share(t, ["b"], ["a", "c"]))  # doctest: +NORMALIZE_WHITESPACE
    Exposed, as a share of the link time: 10.0 % in a, 0.0 % in c, 90.0 % at least in the blocking stages (b's):
    rank 0 waited through less of the link's work in each of a and c than in each blocking stage.
    """
    share = 100 * table["exposed (ms)"] / table["link time (ms)"]
    low, high = share[asynchronous], share[blocking]
    names = " and ".join(asynchronous)
    verdict = (
        f"rank 0 waited through less of the link's work in each of {names} than in each blocking stage"
        if low.max() < high.min()
        else f"not each of {names} below each blocking stage"
    )
    each = ", ".join(f"{low[st]:.1f} % in {st}" for st in asynchronous)
    return (
        f"Exposed, as a share of the link time: {each}, {high.min():.1f} % at least in the blocking stages "
        f"({high.idxmin()}'s): {verdict}."
    )


def last_messages(linked, link, run: Path, a: str, b: str) -> str:
    """A line to print (``run``: the link run's folder): the last message each of stages ``a`` (one message a
    parameter) and ``b`` (buckets) handed over in the link run (rank 0's step), its size and its link time
    (:func:`link_ms`'s model, one message), and each stage's exposed (to 0.1 ms, as :func:`link_table`) split into
    that last message's transfer and earlier ones' (the link carries one at a time, so the parts add up); headed by
    a "why" only where ``b``'s exposed is longer than ``a``'s, the measure it names; one step, not claimed."""
    from minddp.analysis import metrics

    sent, nbytes = rank0(linked.buckets), message_bytes(linked)
    world = int(linked.summary["rank"].nunique())
    waits = rank0(linked.per_step).groupby("stage")["exposed_us"].mean() / 1e3  # ms, as link_table
    last, part, late, busy = {}, {}, {}, {}
    for st in (a, b):
        i = sent.loc[sent["stage"] == st, "ready_us"].idxmax()
        last[st] = (nbytes[i] / 2**20, 1e3 * metrics.link_time(link, [("all_reduce", nbytes[i], world)]))
        iv, s0, _ = lesson.parameter_checks(run, st)
        window = [iv.steps[-1][1:]]
        transfers = sorted(t for t in iv.link if window[0][0] <= t[0] <= window[0][1])  # in order: one at a time
        handed = s0 + sent.loc[i, "ready_us"]
        late[st] = (transfers[-1][0] - handed) / 1e3  # hand-over to the transfer's start
        busy[st] = (transfers[-2][1] - handed) / 1e3 if len(transfers) > 1 else 0.0  # earlier ones on it till then
        exposed = round(waits[st], 1)
        own = round(metrics.exposed(transfers[-1:], iv.waits, window) / 1e3, 1)
        part[st] = (exposed, own, round(exposed - own, 1))
    (ea, _, ra), (eb, _, rb) = part[a], part[b]

    def split(st, noun):
        exposed, own, rest = part[st]
        if rest > 0:
            return f"{own:.1f} ms of {st}'s exposed was that {noun}'s transfer, {rest:.1f} ms earlier {noun}s'"
        if exposed > 0:
            return f"all {exposed:.1f} ms of {st}'s exposed was that {noun}'s transfer"
        return f"{st}'s exposed is 0"

    head = (
        f"Why, with buckets, rank 0 waited longer while its link carried a transfer ({a} → {b}, exposed {ea:.1f} → "
        f"{eb:.1f} ms): "
        if eb > ea
        else ""
    )
    body = (
        f"a message is handed over only once its last gradient is ready, so each stage's last one only once "
        f"the backward's last gradient is: {a}'s, {last[a][0]:.2f} MiB, takes {last[a][1]:.1f} ms on the link, "
        f"{b}'s, the last bucket, {last[b][0]:.2f} MiB, {last[b][1]:.1f} ms. {split(b, 'bucket')[0].upper()}"
        f"{split(b, 'bucket')[1:]}; {split(a, 'message')}"
    )
    if rb > 0 or ra > 0:
        big = 1e3 * metrics.link_time(link, [("all_reduce", nbytes[sent["stage"] == b].max(), world)])
        on = (
            f": earlier buckets (up to {big:.1f} ms each on the link) held it for {min(busy[b], late[b]):.1f} ms of "
            "that"
            if busy[b] > 0
            else ", the link free at the hand-over"
        )
        body += (
            f". The link carries one message at a time, in order: it began {b}'s last bucket {late[b]:.1f} ms after "
            f"its hand-over{on}; {a}'s last message {late[a]:.1f} ms after its hand-over"
        )
    line = head + body if head else body[0].upper() + body[1:]
    return f"{line}."


def band_non_compute(result, run: Path, stages) -> str:
    """A line to print: of ``stages``, the one with the longest backward band (rank 0's step), how much longer that
    band is than ``single``'s longest, how much of each of the two bands is not compute (no training thread inside
    an operator), the difference as a share of the excess, and how much of the stage's is non-compute (a gloo range
    open too, ``metrics.non_compute`` over the band); in words; one profiled step, not claimed."""
    from minddp.analysis import metrics

    p = rank0(result.phases)
    back = p[p["phase"] == "backward"].assign(ms=lambda f: (f["end_us"] - f["start_us"]) / 1e3)

    def idle(stage, band):  # ms of the band (µs from the step's start) with no training thread inside an operator
        iv, s0, _ = lesson.parameter_checks(run, stage)
        window = [(s0 + band["start_us"], s0 + band["end_us"])]
        parts = metrics.breakdown(window, iv.compute, iv.comm)  # not compute: non-compute and idle together
        return (parts["total_time_us"] - parts["compute_time_us"]) / 1e3, parts["non_compute_time_us"] / 1e3

    alone = back.loc[back.loc[back["stage"] == "single", "ms"].idxmax()]
    mine = back[back["stage"].isin(list(stages))]
    band = mine.loc[mine["ms"].idxmax()]
    st = band["stage"]
    excess = round(band["ms"]) - round(alone["ms"])
    if excess <= 0:
        return f"{st}'s longest backward band, {band['ms']:.0f} ms, is no longer than single's longest."
    (off, nc), (off1, _) = idle(st, band), idle("single", alone)
    more = round(round(off, 1) - round(off1, 1), 1)
    share = 100 * more / excess
    how = f"{share:.0f} % of the excess: " + ("most" if share > 50 else "less than half")
    return (
        f"{st}'s longest backward band, {band['ms']:.0f} ms, is {excess} ms longer than single's longest, "
        f"{alone['ms']:.0f} ms. No training thread inside an operator: {off:.1f} ms of {st}'s band (of it "
        f"{nc:.1f} ms with a gloo range open, non-compute, and {off - nc:.1f} ms with none), {off1:.1f} ms of single's"
        + (
            f", {more:.1f} ms more, {how} of the band's excess, in this step, is time {st}'s training threads ran no "
            "operator."
            if more > 0
            else f": none of the band's excess, in this step, is time {st}'s training threads ran no operator."
        )
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


def held_open(shares: pd.DataFrame, sizes: pd.Series, parts: dict) -> str:
    """A line to print: for each group of stages that send the same messages (``sizes``: stage -> sorted message
    sizes; ``parts``: stage -> :func:`in_flight_parts`), how long each one's all_reduce ranges were open (to 0.1 ms),
    and how much longer than the group's shortest for the same bytes, as a share of its in flight (``shares``'
    printed columns): time held open at least, since the shortest's can be held open too; where that is more than
    half of a stage's in flight, what its overlap is a share of; in words, that an overlap does not rank stages by
    what compute hid of their bytes' time, with the pair of stages sending the same bytes a step where the higher
    overlap has the more non-compute, both gaps the widest (their product), if there is one; then the
    collectives the plot does not draw; one profiled step, not claimed.

    >>> t = pd.DataFrame({"in flight (ms)": [10.0, 40.0, 12.0], "overlap (%)": [0.0, 80.0, 5.0],
    ...                   "non-compute (ms)": [10.0, 8.0, 9.0]}, index=["b", "ba", "d"])
    >>> sizes = pd.Series({"b": [1, 2], "ba": [1, 2], "d": [1, 2]})
    >>> parts = {"b": (9.0, 0.0, []), "ba": (30.0, 0.0, []), "d": (11.0, 1.0, ["gloo:broadcast"])}
    >>> print(held_open(t, sizes, parts))  # doctest: +NORMALIZE_WHITESPACE
    b, ba and d send the same 2 messages (the same sizes); their all_reduce ranges (the orange bars of the plot
    below) were open 9.0, 30.0 and 11.0 ms in all. For the same bytes, the others' were open longer than b's (the
    shortest): ba's by 21.0 ms, 52 % of its in flight; d's by 2.0 ms, 17 % of its in flight. At least that much was
    held open (the caveat; the shortest's ranges can be held open too): more than half of ba's in flight, the time
    its overlap (80.0 %) is a share of. An overlap is a share of the time ranges were open, held open included, so
    it does not rank stages by how much of their bytes' time compute hid (in this step, of two stages sending the
    same bytes, the higher overlap had the less non-compute). Also in flight, not drawn:
    gloo:broadcast ranges (the model's buffers, broadcast in a forward) in d.
    >>> t.loc["ba", "non-compute (ms)"] = 12.0
    >>> print(held_open(t, sizes, parts))  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    b, ba and d ... it does not rank stages by how much of their bytes' time compute hid: with the same bytes a
    step, ba's overlap is 80.0 % against d's 5.0 %, yet ba had the more non-compute, 12.0 against 9.0 ms. Also in
    flight, ...
    """

    def names(stages):
        return ", ".join(stages[:-1]) + f" and {stages[-1]}" if len(stages) > 1 else stages[0]

    ov, nc = shares["overlap (%)"], shares["non-compute (ms)"]
    bars = {st: round(parts[st][0], 1) for st in parts}
    groups: dict[tuple, list[str]] = {}
    for st in parts:
        groups.setdefault(tuple(sizes[st]), []).append(st)
    lines = []
    for size, group in groups.items():
        if len(group) < 2:
            continue
        ref = min(group, key=lambda st: bars[st])
        bars_are = "" if lines else " (the orange bars of the plot below)"
        line = (
            f"{names(group)} send the same {len(size)} messages (the same sizes); their all_reduce ranges{bars_are} "
            f"were open {names([f'{bars[st]:.1f}' for st in group])} ms in all."
        )
        longer = {st: bars[st] - bars[ref] for st in group if st != ref and bars[st] > bars[ref]}
        share = {st: 100 * d / shares.loc[st, "in flight (ms)"] for st, d in longer.items()}
        if longer:
            if len(longer) == 1:
                (st, d), (_, pc) = *longer.items(), *share.items()
                line += f" For the same bytes, {st}'s were open {d:.1f} ms longer than {ref}'s, {pc:.0f} % of its"
                line += " in flight."
            else:
                each = "; ".join(
                    f"{st}'s by {d:.1f} ms, {share[st]:.0f} % of its in flight" for st, d in longer.items()
                )
                line += f" For the same bytes, the others' were open longer than {ref}'s (the shortest): {each}."
            line += (
                " At least that much was held open (the caveat; the shortest's ranges can be held open too)"
                if len(lines) == 0
                else " At least that much was held open"
            )
            over = [st for st in longer if share[st] > 50]
            if over:
                one, whose = len(over) == 1, names([f"{st}'s" for st in over])
                ovs = names([f"{ov[st]:.1f}" for st in over])
                line += (
                    f": more than half of {whose} in flight, the time {'its overlap' if one else 'their overlaps'} "
                    f"({ovs} %) {'is a share' if one else 'are shares'} of"
                )
            line += "."
        lines.append(line)
    said = (
        "An overlap is a share of the time ranges were open, held open included, so it does not rank stages by how "
        "much of their bytes' time compute hid"
    )
    a_step = {st: sum(sizes[st]) for st in parts}  # the bytes a step, as numbers
    pairs = [(x, y) for x in parts for y in parts if a_step[x] == a_step[y] and ov[x] > ov[y] and nc[x] > nc[y]]
    if pairs:  # the pair furthest apart both ways: overlap gap (points) times non-compute gap (ms)
        x, y = max(pairs, key=lambda p: (ov[p[0]] - ov[p[1]]) * (nc[p[0]] - nc[p[1]]))
        said += (
            f": with the same bytes a step, {x}'s overlap is {ov[x]:.1f} % against {y}'s {ov[y]:.1f} %, yet {x} had "
            f"the more non-compute, {nc[x]:.1f} against {nc[y]:.1f} ms"
        )
    else:
        said += " (in this step, of two stages sending the same bytes, the higher overlap had the less non-compute)"
    lines.append(said + ".")
    other: dict[str, list[str]] = {}
    for st in parts:
        for n in parts[st][2]:
            other.setdefault(n, []).append(st)
    if other:
        what = "; ".join(
            f"{n} ranges ({NOT_DRAWN[n]}) in {names(sts)}" if n in NOT_DRAWN else f"{n} ranges in {names(sts)}"
            for n, sts in other.items()
        )
        lines.append(f"Also in flight, not drawn: {what}.")
    return " ".join(lines)


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


def overlap_order(ov: pd.Series, blocking: list[str], asynchronous: list[str]) -> str:
    """A line to print: the range of the ``asynchronous`` and of the ``blocking`` stages' overlaps (``ov``, %), and in
    words whether each of the first is above each of the second; one profiled step, not claimed.

    >>> print(overlap_order(pd.Series({"b": 5.0, "a": 60.0}), ["b"], ["a"]))  # doctest: +NORMALIZE_WHITESPACE
    Overlap: 60.0–60.0 % in the asynchronous stages, 5.0–5.0 % in the blocking ones: each asynchronous stage's is
    above each blocking stage's (a blocking stage's overlap is compute beside ranges still open after its training
    thread went on: the caveat).
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
    held = (
        " (a blocking stage's overlap is compute beside ranges still open after its training thread went on: the "
        "caveat)"
        if lo > 0
        else ""
    )
    return f"{line}: each asynchronous stage's is above each blocking stage's{held}."


def outside_checks(shares: pd.DataFrame, pairs: list[tuple[str, str]]) -> str:
    """A line to print: for each (blocking, asynchronous) pair, the two stages' non-compute and its part outside the
    parameter checks (``shares``' printed columns), and in words how much of the difference the checks make; one
    profiled step, not claimed.

    >>> t = pd.DataFrame({"non-compute (ms)": [24.5, 42.0], "of it, in the checks (ms)": [4.8, 25.4]},
    ...                  index=["b", "ba"])
    >>> print(outside_checks(t, [("b", "ba")]))  # doctest: +NORMALIZE_WHITESPACE
    Non-compute outside the parameter checks: b 19.7, ba 16.6 ms; ba's non-compute is 17.5 ms more than b's, all of
    it in its check: outside the checks ba's is 3.1 ms less.
    """
    nc, chk = shares["non-compute (ms)"], shares["of it, in the checks (ms)"]
    out = (nc - chk).round(1)
    said = []
    for a, b in pairs:
        d, do = round(nc[b] - nc[a], 1), round(out[b] - out[a], 1)
        if d <= 0:
            more = f", but outside the checks {do:.1f} ms more" if do > 0 else ", outside the checks too"
            said.append(f"{b}'s non-compute is no more than {a}'s{more}")
        elif do <= 0:
            less = f"{-do:.1f} ms less" if do < 0 else "as much"
            said.append(
                f"{b}'s non-compute is {d:.1f} ms more than {a}'s, all of it in its check: outside the checks "
                f"{b}'s is {less}"
            )
        else:
            said.append(f"{b}'s non-compute is {d:.1f} ms more than {a}'s, {do:.1f} ms of it outside the checks")
    each = ", ".join(f"{st} {out[st]:.1f}" for a, b in pairs for st in (a, b))
    return f"Non-compute outside the parameter checks: {each} ms; {'; '.join(said)}."


def link_after_backward(linked, run: Path, stages) -> str:
    """A line to print (``run``: the link run's folder): for each of ``stages``, when rank 0's link ended its last
    transfer of the profiled step, against the end of the step's last backward band (ms); one step, not claimed.
    Waiting for a message starts in the finish, after that band, in the asynchronous stages."""
    p = rank0(linked.phases)
    said = []
    for st in stages:
        iv, s0, _ = lesson.parameter_checks(run, st)
        s1 = iv.steps[-1][2]
        end = s0 + p.loc[(p["stage"] == st) & (p["phase"] == "backward"), "end_us"].max()
        last = max(b for a, b in iv.link if s0 <= a <= s1)
        d = (last - end) / 1e3
        when = f"{d:.1f} ms after" if round(d, 1) > 0 else f"{-d:.1f} ms before" if round(d, 1) < 0 else "as"
        said.append(f"{when} the step's last backward ended in {st}" if not said else f"{when} in {st}")
    return f"In the link run, rank 0's link finished the step's last transfer {', '.join(said)}."
