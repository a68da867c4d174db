"""Two runs, "what changed": their settings' differences and one table of A, B, Δ and B/A per stage and number.

1. **settings**: each run's ``config.json`` files (one per stage) give its settings; a key whose value
   differs between the runs is a change (``link: None → 1gbit``), except the keys that name the run or where
   it was written (:data:`NOT_SETTINGS`);
2. **stages**: those in one run only are named, never compared as NaN;
3. **numbers**: per stage in both, each per-step number's median over the profiled steps in A and in B
   (ranks averaged step by step: :func:`minddp.analysis.verdict.stage_spread`), ``Δ = B − A``, ``B/A``; a Δ
   whose two runs' ranges (min–max over their profiled steps) overlap is marked ``within spread``: the runs'
   own step-to-step variation covers it;
4. **one block** (:func:`changes_block`) of all three, which the console and the page render alike.

Example (the settings of two runs, as their config.json files hold them)::

    >>> config_changes({"ddp": {"link": None, "run_name": "a"}}, {"ddp": {"link": "1gbit", "run_name": "b"}})
    [('link', 'None', '1gbit')]
"""

from __future__ import annotations

import pandas as pd

from minddp.analysis.blocks import Block, Cell, Column, Row, Table
from minddp.analysis.names import KINDS, MEASURES, STARRED, stage_sort_key
from minddp.analysis.verdict import stage_spread

#: config.json keys that say where or under which name a run was written, not how it ran (step 1).
NOT_SETTINGS = {"run_name", "run", "trace_dir", "stage", "summary_json", "analyze", "progress", "checkpoint_dir"}

#: The numbers compared (step 3): per-step column -> (what the table prints, factor from the stored unit).
NUMBERS = {
    **{c: MEASURES[c] for c in ("step_time_us", "non_compute_us", "comm_time_us", "overlap_pctg")},
    **{c: MEASURES[c] for c in ("waited_us", "exposed_us")},
    **{f"{k.key}_calls": (f"{k.name} calls{'*' if k.starred else ''}", 1.0) for k in KINDS},
    **{f"{k.key}_bytes": (f"{k.name} (MiB){'*' if k.starred else ''}", 2.0**-20) for k in KINDS},
}

#: The difference table's columns (step 4): header, console width, and whether it holds text (else numbers).
TABLE = [
    ("stage", 13, True),
    ("number", 23, True),
    ("A", 10, False),
    ("B", 10, False),
    ("Δ = B − A", 10, False),
    ("B/A", 6, False),
    ("note", 0, True),
]


def _settings(configs: dict[str, dict]) -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for config in configs.values():
        for key, value in config.items():
            if key not in NOT_SETTINGS:
                values.setdefault(key, set()).add(str(value))
    return values


def config_changes(configs_a: dict[str, dict], configs_b: dict[str, dict]) -> list[tuple[str, str, str]]:
    """Step 1: ``(key, value in A, value in B)`` for each setting that differs (several values: joined by ``/``)."""
    a, b = _settings(configs_a), _settings(configs_b)
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, {"(not set)"}), b.get(key, {"(not set)"})
        if va != vb:
            out.append((key, " / ".join(sorted(va)), " / ".join(sorted(vb))))
    return out


def difference(ra, rb) -> pd.DataFrame:
    """Steps 2-3: one row per (stage, number) for stages in both runs, one row per stage in one run only.

    Columns: ``stage``, ``number``, ``A``, ``A_min``, ``A_max``, ``B``, ``B_min``, ``B_max``, ``delta``, ``ratio``,
    ``note`` (``same``: equal at every step of both runs, ``within spread``, ``only in A``, ``only in B``,
    ``not measured in A``/``B``, or empty), in reading order of the stages.
    Numbers that are 0 in both runs (an all_gather count of a stage that gathers nothing), or that neither run's
    trace gives (waited and exposed time without a link), are left out.
    """
    sa, sb = stage_spread(ra, list(NUMBERS)), stage_spread(rb, list(NUMBERS))
    rows = []
    for stage in sorted(set(sa.index) | set(sb.index), key=stage_sort_key):
        if stage not in sb.index or stage not in sa.index:
            rows.append({"stage": stage, "number": "", "note": "only in A" if stage in sa.index else "only in B"})
            continue
        for column, (name, factor) in NUMBERS.items():
            if (column, "median") not in sa.columns or (column, "median") not in sb.columns:
                continue
            a = [sa.loc[stage, (column, s)] * factor for s in ("median", "min", "max")]
            b = [sb.loc[stage, (column, s)] * factor for s in ("median", "min", "max")]
            if a[0] == 0 and b[0] == 0 and a[2] == 0 and b[2] == 0 or a[0] != a[0] and b[0] != b[0]:
                continue
            overlap = max(a[1], b[1]) <= min(a[2], b[2])
            same = a == b and a[1] == a[2]  # the same value at every step of both runs (a count)
            unmeasured = "not measured in A" if a[0] != a[0] else "not measured in B" if b[0] != b[0] else ""
            rows.append(
                {
                    "stage": stage,
                    "number": name,
                    "A": a[0],
                    "A_min": a[1],
                    "A_max": a[2],
                    "B": b[0],
                    "B_min": b[1],
                    "B_max": b[2],
                    "delta": b[0] - a[0],
                    "ratio": b[0] / a[0] if a[0] else float("nan"),
                    "note": unmeasured or ("same" if same else "within spread" if overlap else ""),
                }
            )
    return pd.DataFrame(
        rows,
        columns=["stage", "number", "A", "A_min", "A_max", "B", "B_min", "B_max", "delta"]
        + [
            "ratio",
            "note",
        ],
    )


def same_text(table: pd.DataFrame) -> str:
    """The line that names what the tables leave out: the numbers equal at every step of both runs."""
    same = table[table["note"] == "same"]
    if same.empty:
        return "no number was the same at every step of both runs"
    names = ", ".join(dict.fromkeys(same["number"]))
    return f"left out, the same at every step of both runs: {names} ({len(same)} rows in all)"


def number_text(x: float) -> str:
    """A number at a precision that keeps small ones visible: ``126.4``, ``0.305``, ``2e-05``; ``–``: not known."""
    if x != x:
        return "–"
    if x == 0:
        return "0"
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def changes_block(ra, rb) -> Block:
    """Steps 1-4 for two :class:`~minddp.analysis.RunAnalysis` results: the settings that changed, the stages in
    one run only, and the difference table (its noise greyed on the page), as one block."""
    block = Block("changes", f"What changed: A = {ra.run}, B = {rb.run}")
    changes = config_changes(ra.configs, rb.configs)
    if not ra.configs and not rb.configs:
        block.paragraphs.append("Neither run has a config.json: its settings are unknown.")
    elif not changes:
        block.paragraphs.append("No setting differs: what differs below is the runs' own variation.")
    block.items = [f"``{key}``: {va} → {vb}" for key, va, vb in changes]
    table = difference(ra, rb)
    only = table[table["note"].isin(["only in A", "only in B"])]
    if len(only):
        named = ", ".join(f"**{s}** {n}" for s, n in zip(only["stage"], only["note"]))
        block.paragraphs.append(f"Not compared: {named}.")
    block.paragraphs.append(
        "Per stage and number: the median over each run's profiled steps (on the page, least–most in brackets), "
        "Δ = B − A and B/A; a note 'within spread' (greyed on the page) says the two runs' ranges overlap, so their "
        "own step-to-step variation covers the difference."
    )
    columns = [Column(header, width, left=left) for header, width, left in TABLE]
    rows, last = [], None
    for r in table[~table["note"].isin(["same", "only in A", "only in B"])].to_dict("records"):
        stage = r["stage"] if r["stage"] != last else ""
        last = r["stage"]
        cells = [Cell(stage), Cell(r["number"])]
        for run in ("A", "B"):
            low, high = (number_text(r[run + end]) for end in ("_min", "_max"))
            cells.append(Cell(number_text(r[run]), f"{low}–{high}" if r[run] == r[run] else ""))
        sign = "+" if r["delta"] > 0 else ""
        ratio = "–" if r["ratio"] != r["ratio"] else f"{r['ratio']:.2f}"
        cells += [Cell(sign + number_text(r["delta"])), Cell(ratio), Cell(r["note"])]
        rows.append(Row(cells, css="noise" if r["note"] else ""))
    block.table = Table(columns, rows, id="difference")
    block.notes.append(same_text(table))
    if any(str(n).endswith("*") for n in table["number"]):
        block.notes.append(STARRED)
    return block
