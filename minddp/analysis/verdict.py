"""The verdict: which stage is fastest, which exposes the least communication, and why, from the trace alone.

A practitioner opens a report to learn which stage wins, by how much, and why. Per profiled step
of each rank (:func:`step_anatomy`) the trace gives:

1. **exposed communication**: ``|(M ∩ step) ∖ C|``, a message in flight while the training thread
   computed nothing: the trace's stand-in for "step minus the same stage with ``noop_hook``"
   (which ``python -m minddp.bench`` measures), split by where in the step it falls (:data:`REGIONS`):
   in **forward** (parameter all-gathers ahead of the compute), inside **backward** (a hook that
   waits for each message), **between** micro-batches (a sync after each backward), in the **tail**
   between the last backward and the optimizer (the step waiting for the last buckets), in the
   **optimizer** step and after it;
2. **messages in flight during backward**: ``|M ∩ backward|``, the communication that had
   compute beside it to hide behind; and the **tail**: how long after backward's end the last
   message ended;
3. **overlap**: ``|M ∩ C| / |M|`` per step (docs/analysis.md).

Then per stage (:func:`stage_spread`): each number's median over the profiled steps (ranks averaged
step by step) and its spread (min–max over those steps); :func:`ranking` orders the stages by exposed
communication and by step time, and :func:`why` says in one sentence where each stage's exposed
time goes. The phases come from :func:`minddp.analysis.cpu.step_phases` (CPU traces); a GPU trace
has no phases, so it gets steps 1 (total only) and 3.

Example (one step by hand: backward 10..50, optimizer 60..70, compute in both, one message 40..65)::

    >>> from minddp.analysis.steps import RankIntervals
    >>> iv = RankIntervals(steps=[(1, 0.0, 80.0)], compute=[(10, 50), (60, 70)], comm=[(40, 65)], allreduces=[])
    >>> phases = [{"step": 1, "phase": "backward", "start_us": 10, "end_us": 50},
    ...           {"step": 1, "phase": "optimizer", "start_us": 60, "end_us": 70}]
    >>> a = step_anatomy(iv, phases)[0]
    >>> a["exposed_comm_us"], a["exposed_tail_us"], a["comm_in_backward_us"], a["tail_us"]
    (10.0, 10.0, 10.0, 15.0)
"""

from __future__ import annotations

import pandas as pd

from minddp.analysis.steps import REGIONS, step_anatomy  # noqa: F401 - step_anatomy: its doc's example

#: The per-step numbers the verdict reads, by column of :attr:`RunAnalysis.per_step`.
SPREAD_COLUMNS = [
    "step_time_us",
    "exposed_comm_us",
    "comm_time_us",
    "comm_in_backward_us",
    "tail_us",
    "overlap_pctg",
    *REGIONS,
]

#: One line on what the numbers mean on a CPU (gloo), printed beside every verdict.
CPU_MEANING = (
    "On a CPU (gloo) a message is 'in flight' from the moment gloo's thread picks it up, waits for the other "
    "rank and for a free core included, and the ranks' threads share the cores: read exposed communication and "
    "overlap as orders and shapes, not as network time; a GPU trace (NCCL) is much closer to transfer time "
    "(docs/analysis.md)."
)


def stage_spread(result, columns: list[str] | None = None) -> pd.DataFrame:
    """Per stage and per-step number: ``median``, ``min``, ``max`` over the profiled steps (ranks averaged per step).

    Columns are ``(number, statistic)`` for ``columns`` of :attr:`RunAnalysis.per_step` (default
    :data:`SPREAD_COLUMNS`), and ``steps``; rows are the stages in reading order.
    """
    from minddp.analysis import stage_sort_key

    steps = result.per_step
    present = [c for c in (columns or SPREAD_COLUMNS) if c in steps.columns]
    per_step = steps.groupby(["stage", "step"], sort=False)[present].mean()  # the ranks, step by step
    spread = per_step.groupby(level="stage", sort=False).agg(["median", "min", "max"])
    spread[("steps", "")] = per_step.groupby(level="stage", sort=False).size()
    return spread.reindex(sorted(spread.index, key=stage_sort_key))


def ranking(result) -> pd.DataFrame:
    """Every stage with communication, least exposed communication first (ties: the faster step first).

    Columns: ``exposed_ms`` and ``step_ms`` (medians over the profiled steps), their ``_min``/``_max``, ``rank_exposed``
    and ``rank_step`` (1 = least exposed / fastest), ``in_backward_pct`` (the share of message time that ran during
    backward), ``overlap_pct`` and its spread, ``why`` (:func:`why`). Stages without communication (``single``) are
    left out: they are the reference, not a contender.
    """
    spread = stage_spread(result)
    rows = []
    for stage, s in spread.iterrows():
        comm = s[("comm_time_us", "median")]
        if not comm > 0:
            continue
        row = {"stage": stage, "steps": int(s[("steps", "")])}
        for name, column in (("exposed", "exposed_comm_us"), ("step", "step_time_us"), ("comm", "comm_time_us")):
            for stat, suffix in (("median", ""), ("min", "_min"), ("max", "_max")):
                row[f"{name}_ms{suffix}"] = s[(column, stat)] / 1e3
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
    table = table.sort_values(["exposed_ms", "step_ms"], kind="stable").reset_index(drop=True)
    table.insert(0, "rank_exposed", range(1, len(table) + 1))
    calls = _calls(result)
    table["why"] = [why(r, calls.get(r["stage"], {})) for r in table.to_dict("records")]
    return table


#: The collective kinds a step's messages are counted by, with the words a table prints for each.
KINDS = {
    "allreduce": "all_reduce",
    "reducescatter": "reduce-scatter (as all_reduce on gloo)",
    "allgather": "all_gather",
}


def _calls(result) -> dict[str, dict[str, float]]:
    """Per stage: collective calls per profiled step, by kind (``KINDS``)."""
    stages = result.stages
    return {
        stage: {kind: float(stages.loc[stage, f"{kind}_calls_per_step"]) for kind in KINDS} for stage in stages.index
    }


def calls_text(calls: dict[str, float]) -> str:
    """``3 reduce-scatters, 4 all_gathers`` (kinds with calls only); reduce-scatters are all_reduces on gloo."""
    names = {"allreduce": "all_reduce", "reducescatter": "reduce-scatter", "allgather": "all_gather"}
    parts = [f"{n:g} {names[k]}{'s' if n != 1 else ''}" for k, n in calls.items() if n]
    return ", ".join(parts) or "no collective"


def why(row: dict, calls: dict[str, float]) -> str:
    """One sentence: the stage's messages, how much ran during backward, and where its exposed time goes (step 1)."""
    head = f"{calls_text(calls)} a step" if calls else "its messages"
    exposed, comm = row["exposed_ms"], row["comm_ms"]
    parts = {r: row.get(r.replace("_us", "_ms"), float("nan")) for r in REGIONS}
    parts = {r: v for r, v in parts.items() if v == v}  # NaN: a GPU trace, no phases
    if not parts:
        return (
            f"{head}; {exposed:.1f} of its {comm:.1f} ms of messages in flight were exposed (no phases in the trace)."
        )
    during = row["in_backward_pct"]
    where = max(parts, key=parts.get)
    sentence = f"{head}; {during:.0f} % of its {comm:.1f} ms of messages in flight ran during backward; "
    if exposed < 0.05 * row["step_ms"]:
        return sentence + f"only {exposed:.1f} ms exposed ({100 * exposed / row['step_ms']:.0f} % of the step)."
    sentence += f"{exposed:.1f} ms exposed, most of it ({parts[where]:.1f} ms) {REGIONS[where]}"
    if where == "exposed_tail_us":
        sentence += f": the last message ended {row['tail_ms']:.1f} ms after backward"
    return sentence + "."
