"""The verdict: which stage is fastest, which leaves the least communication uncovered, and why, from the trace alone.

A practitioner opens a report to learn which stage wins, by how much, and why. Per profiled step
of each rank (:func:`~minddp.analysis.steps.step_anatomy`) the trace gives the measures of
:mod:`minddp.analysis.metrics` (docs/analysis.md, "The measures"):

1. **non-compute**: ``|(M ∩ step) ∖ C|``, a message in flight while the training thread computed nothing (HTA's
   non-compute time, per step): what a trace alone can say about the **exposed** time (the link's transfers the
   training thread waited through, known where the link is emulated; ``python -m minddp.bench``'s *comm cost*,
   against ``noop_hook``, is more), split by where in the step it falls (:data:`~minddp.analysis.steps.REGIONS`):
   in **forward** (parameter all-gathers ahead of the compute), inside **backward** (*interleaved*: a hook that
   waits for each message), **between** micro-batches (a sync after each backward), in the **tail** between the
   last backward and the optimizer (the step waiting for the last buckets), in the **optimizer** step and after it;
2. **in flight during backward**: ``|M ∩ backward|``, the communication that had compute beside it to hide
   behind; and the **tail**: how long after backward's end the last message ended;
3. **overlap**: ``|M ∩ C| / |M|`` per step;
4. over an emulated link whose waits the trace records: **waited** and **exposed**.

Then per stage (:func:`stage_spread`): each number's median over the profiled steps (ranks averaged step by step)
and its spread (min–max over those steps); :func:`ranking` orders the stages by non-compute time and by step
time, :func:`why` says in one sentence where each stage's non-compute time goes, and :func:`verdict_block` puts
it all in one :class:`~minddp.analysis.blocks.Block`, which the console and the page render alike. The phases
come from :func:`minddp.analysis.cpu.step_phases` (CPU traces); a GPU trace has no phases, so it gets steps 1
(total only), 3 and 4.

Example (one step by hand: backward 10..50, optimizer 60..70, compute in both, one message 40..65)::

    >>> from minddp.analysis.steps import RankIntervals
    >>> iv = RankIntervals(steps=[(1, 0.0, 80.0)], compute=[(10, 50), (60, 70)], comm=[(40, 65)], allreduces=[])
    >>> phases = [{"step": 1, "phase": "backward", "start_us": 10, "end_us": 50},
    ...           {"step": 1, "phase": "optimizer", "start_us": 60, "end_us": 70}]
    >>> a = step_anatomy(iv, phases)[0]
    >>> a["non_compute_us"], a["non_compute_tail_us"], a["comm_in_backward_us"], a["tail_us"]
    (10.0, 10.0, 10.0, 15.0)
"""

from __future__ import annotations

import pandas as pd

from minddp.analysis.blocks import Block, Cell, Column, Row, Table
from minddp.analysis.names import KINDS, stage_sort_key
from minddp.analysis.steps import REGIONS, step_anatomy  # noqa: F401 - step_anatomy: its doc's example

#: The per-step numbers the verdict reads, by column of :attr:`RunAnalysis.per_step`.
SPREAD_COLUMNS = [
    "step_time_us",
    "non_compute_us",
    "comm_time_us",
    "comm_in_backward_us",
    "tail_us",
    "overlap_pctg",
    "waited_us",
    "exposed_us",
    *REGIONS,
]

#: One line on what the numbers mean on a CPU (gloo), printed beside every verdict.
CPU_MEANING = (
    "On a CPU (gloo) a message is 'in flight' from the moment gloo's thread picks it up, waits for the other "
    "rank and for a free core included, and the ranks' threads share the cores: read non-compute time and "
    "overlap as orders and shapes, not as network time; a GPU trace (NCCL) is much closer to transfer time "
    "(docs/analysis.md)."
)
#: What the ranked number is, printed under every verdict.
MEANING = (
    "Non-compute is the time a message was in flight while the training thread computed nothing "
    "(HolisticTraceAnalysis's non-compute time, per step; inside backward it is the interleaved time): what a "
    "trace alone says about the exposed time, the link's transfers the training thread waited through "
    "(python -m minddp.bench's comm cost, the stage against itself with noop_hook, is all that sending adds, "
    "waits for the other rank included). Over an emulated link the trace records the training thread's waits, and "
    "the waited and exposed columns come from them. Each number is the median over the profiled steps (ranks "
    "averaged step by step), with the least and the most of them in brackets."
)


def stage_spread(result, columns: list[str] | None = None) -> pd.DataFrame:
    """Per stage and per-step number: ``median``, ``min``, ``max`` over the profiled steps (ranks averaged per step).

    Columns are ``(number, statistic)`` for ``columns`` of :attr:`RunAnalysis.per_step` (default
    :data:`SPREAD_COLUMNS`), and ``steps``; rows are the stages in reading order.
    """
    steps = result.per_step
    present = [c for c in (columns or SPREAD_COLUMNS) if c in steps.columns]
    per_step = steps.groupby(["stage", "step"], sort=False)[present].mean()  # the ranks, step by step
    spread = per_step.groupby(level="stage", sort=False).agg(["median", "min", "max"])
    spread[("steps", "")] = per_step.groupby(level="stage", sort=False).size()
    return spread.reindex(sorted(spread.index, key=stage_sort_key))


def ranking(result) -> pd.DataFrame:
    """Every stage with communication, least non-compute time first (ties: the faster step first).

    Columns: for ``non_compute``, ``step``, ``comm`` (in flight), ``waited`` and ``exposed`` (NaN where the trace
    records no waits), ``<name>_ms`` (the median over the profiled steps) and its ``_min``/``_max``; ``overlap_pct``
    and its spread; ``rank_non_compute`` and ``rank_step`` (1 = least non-compute / fastest), ``in_backward_pct``
    (the share of the time in flight that ran during backward), ``tail_ms``, the regions of :data:`REGIONS` in ms,
    ``why`` (:func:`why`). Stages without communication (``single``) are left out: they are the reference, not a
    contender.
    """
    spread = stage_spread(result)
    rows = []
    for stage, s in spread.iterrows():
        comm = s[("comm_time_us", "median")]
        if not comm > 0:
            continue
        row = {"stage": stage, "steps": int(s[("steps", "")])}
        named = {"non_compute": "non_compute_us", "step": "step_time_us", "comm": "comm_time_us"}
        named.update(waited="waited_us", exposed="exposed_us")
        for name, column in named.items():
            for stat, suffix in (("median", ""), ("min", "_min"), ("max", "_max")):
                row[f"{name}_ms{suffix}"] = s.get((column, stat), float("nan")) / 1e3
        for stat, suffix in (("median", ""), ("min", "_min"), ("max", "_max")):
            row[f"overlap_pct{suffix}"] = s[("overlap_pctg", stat)]
        in_bw = s.get(("comm_in_backward_us", "median"))
        row["in_backward_pct"] = 100.0 * in_bw / comm if in_bw == in_bw and in_bw is not None else float("nan")
        row["tail_ms"] = s.get(("tail_us", "median"), float("nan")) / 1e3
        for region in REGIONS:
            row[region.replace("_us", "_ms")] = s.get((region, "median"), float("nan")) / 1e3
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["rank_step"] = table["step_ms"].rank(method="first").astype(int)
    table = table.sort_values(["non_compute_ms", "step_ms"], kind="stable").reset_index(drop=True)
    table.insert(0, "rank_non_compute", range(1, len(table) + 1))
    calls = _calls(result)
    table["why"] = [why(r, calls.get(r["stage"], {})) for r in table.to_dict("records")]
    return table


def _calls(result) -> dict[str, dict[str, float]]:
    """Per stage: collective calls per profiled step, by kind (:data:`~minddp.analysis.names.KINDS`)."""
    stages = result.stages
    return {
        stage: {kind.key: float(stages.loc[stage, f"{kind.key}_calls_per_step"]) for kind in KINDS}
        for stage in stages.index
    }


def calls_text(calls: dict[str, float]) -> str:
    """``3 reduce-scatters, 4 all_gathers`` (kinds with calls only); reduce-scatters are all_reduces on gloo."""
    parts = [kind.count(calls[kind.key]) for kind in KINDS if calls.get(kind.key)]
    return ", ".join(parts) or "no collective"


def why(row: dict, calls: dict[str, float]) -> str:
    """One sentence: the stage's messages, how much ran during backward, and where its non-compute time goes."""
    head = f"{calls_text(calls)} a step" if calls else "its messages"
    non_compute, comm = row["non_compute_ms"], row["comm_ms"]
    parts = {r: row.get(r.replace("_us", "_ms"), float("nan")) for r in REGIONS}
    parts = {r: v for r, v in parts.items() if v == v}  # NaN: a GPU trace, no phases
    if not parts:
        return (
            f"{head}; {non_compute:.1f} of its {comm:.1f} ms of messages in flight were non-compute "
            "(no phases in the trace)."
        )
    during = row["in_backward_pct"]
    where = max(parts, key=parts.get)
    sentence = f"{head}; {during:.0f} % of its {comm:.1f} ms of messages in flight ran during backward; "
    if non_compute < 0.05 * row["step_ms"]:
        return (
            sentence
            + f"only {non_compute:.1f} ms non-compute ({100 * non_compute / row['step_ms']:.0f} % of the step)."
        )
    sentence += f"{non_compute:.1f} ms non-compute, most of it ({parts[where]:.1f} ms) {REGIONS[where]}"
    if where == "non_compute_tail_us":
        sentence += f": the last message ended {row['tail_ms']:.1f} ms after backward"
    return sentence + "."


def _range(median: float, low: float, high: float, fmt: str = ".1f") -> str:
    return f"{low:{fmt}}–{high:{fmt}}" if median == median else ""


def _ms(row: dict, name: str) -> Cell:
    """``row[name]`` (ms) with its spread; ``–`` where the trace does not give it."""
    median = row[name]
    if median != median:
        return Cell("–")
    return Cell(f"{median:.1f}", _range(median, row[f"{name}_min"], row[f"{name}_max"]))


def _percent(value: float) -> str:
    return "–" if value != value else f"{value:.0f}"  # NaN: the trace names no backward (a GPU trace)


def verdict_block(result) -> Block:
    """The verdict of one run as one block (module doc): the headline, the ranking's table, one sentence per stage
    (why), and what the numbers mean; the console and the page render it alike (:mod:`~minddp.analysis.blocks`)."""
    table = ranking(result)
    block = Block(f"verdict-{result.run}", f"Verdict: {result.run}", css="verdict")
    if table.empty:
        block.paragraphs.append("No stage communicated in its profiled steps: nothing to rank.")
        return block
    least, most = table.iloc[0], table.iloc[-1]
    by_step = table.sort_values("rank_step")
    fast, slow = by_step.iloc[0], by_step.iloc[-1]
    headline = (
        f"Least non-compute: **{least['stage']}**, {least['non_compute_ms']:.1f} ms a step; most: **{most['stage']}**, "
        f"{most['non_compute_ms']:.1f} ms. Fastest step: **{fast['stage']}**, {fast['step_ms']:.1f} ms; slowest: "
        f"**{slow['stage']}**, {slow['step_ms']:.1f} ms."
    )
    spread = stage_spread(result, ["step_time_us"])
    if "single" in spread.index:
        single = spread.loc["single", ("step_time_us", "median")] / 1e3
        headline += f" Without communication, **single** (one process, the global batch): {single:.1f} ms."
    linked = table["exposed_ms"].notna()
    if linked.any():
        best = table[linked].sort_values("exposed_ms", kind="stable").iloc[0]
        headline += f" Least exposed over the link: **{best['stage']}**, {best['exposed_ms']:.1f} ms a step."
    block.paragraphs.append(headline)
    columns = [
        Column("#", 2),
        Column("stage", 13, left=True),
        Column("non-compute (ms)", 20, console_spread=True),
        Column("step (ms)", 9),
        Column("# by step", 9),
        Column("overlap (%)", 11),
        Column("in flight in backward (%)", 25),
    ]
    if linked.any():
        columns += [Column("waited (ms)", 11), Column("exposed (ms)", 12)]
    columns.append(Column("why (from the trace)", left=True, wide=True, css="why"))
    rows = []
    for r in table.to_dict("records"):
        cells = [
            Cell(str(r["rank_non_compute"])),
            Cell(f"**{r['stage']}**"),
            _ms(r, "non_compute_ms"),
            _ms(r, "step_ms"),
            Cell(str(r["rank_step"])),
            Cell(
                _percent(r["overlap_pct"]), _range(r["overlap_pct"], r["overlap_pct_min"], r["overlap_pct_max"], ".0f")
            ),
            Cell(_percent(r["in_backward_pct"])),
        ]
        if linked.any():
            cells += [_ms(r, "waited_ms"), _ms(r, "exposed_ms")]
        rows.append(Row(cells + [Cell(r["why"])], data={"stage": r["stage"]}))
    block.table = Table(columns, rows, id=f"ranking-{result.run}", css="ranking")
    block.notes.append(MEANING)
    if any(result.summary["device"] == "cpu"):
        block.notes.append(CPU_MEANING)
    return block
