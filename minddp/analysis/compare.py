"""Two runs, "what changed": their settings' differences and one table of A, B, Δ and B/A per stage and number.

1. **settings**: each run's ``config.json`` files (one per stage) give its settings; a key whose value
   differs between the runs is a change (``link: None → 1gbit``), except the keys that name the run or where
   it was written (:data:`NOT_SETTINGS`);
2. **stages**: those in one run only are named, never compared as NaN;
3. **numbers**: per stage in both, each per-step number's median over the profiled steps in A and in B
   (ranks averaged step by step: :func:`minddp.analysis.verdict.stage_spread`), ``Δ = B − A``, ``B/A``; a Δ
   whose two runs' ranges (min–max over their profiled steps) overlap is marked ``within spread``: the runs'
   own step-to-step variation covers it.

Example (the settings of two runs, as their config.json files hold them)::

    >>> config_changes({"ddp": {"link": None, "run_name": "a"}}, {"ddp": {"link": "1gbit", "run_name": "b"}})
    [('link', 'None', '1gbit')]
"""

from __future__ import annotations

import textwrap

import pandas as pd

#: config.json keys that say where or under which name a run was written, not how it ran (step 1).
NOT_SETTINGS = {"run_name", "run", "trace_dir", "stage", "summary_json", "analyze", "progress", "checkpoint_dir"}

#: The numbers compared (step 3): per-step column -> (what the table prints, factor from the stored unit).
NUMBERS = {
    "step_time_us": ("step (ms)", 1e-3),
    "exposed_comm_us": ("exposed comm (ms)", 1e-3),
    "comm_time_us": ("comm in flight (ms)", 1e-3),
    "overlap_pctg": ("overlap (%)", 1.0),
    "allreduce_calls": ("all_reduce calls", 1.0),
    "reducescatter_calls": ("reduce-scatter calls*", 1.0),
    "allgather_calls": ("all_gather calls", 1.0),
    "allreduce_bytes": ("all_reduce (MiB)", 2.0**-20),
    "reducescatter_bytes": ("reduce-scatter (MiB)*", 2.0**-20),
    "allgather_bytes": ("all_gather (MiB)", 2.0**-20),
}
#: The footnote of the starred rows.
STARRED = "* on gloo a reduce-scatter runs as an all_reduce of the whole bucket (Wire.reduce_scatter)"


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
    ``note`` (``same``: equal at every step of both runs, ``within spread``, ``only in A``, ``only in B``, or
    empty), in reading order of the stages.
    Numbers that are 0 in both runs (an all_gather count of a stage that gathers nothing) are left out.
    """
    from minddp.analysis import stage_sort_key
    from minddp.analysis.verdict import stage_spread

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
            if a[0] == 0 and b[0] == 0 and a[2] == 0 and b[2] == 0:
                continue
            overlap = max(a[1], b[1]) <= min(a[2], b[2])
            same = a == b and a[1] == a[2]  # the same value at every step of both runs (a count)
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
                    "note": "same" if same else "within spread" if overlap else "",
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
    """A number at a precision that keeps small ones visible: ``126.4``, ``0.305``, ``2e-05``."""
    if x == 0:
        return "0"
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def difference_text(table: pd.DataFrame, label_a: str, label_b: str) -> str:
    """The difference table as fixed-width lines of at most 120 characters (the console's form)."""
    head = f"{'stage':<13}{'number':<24}{'A':>10}{'B':>10}{'Δ = B − A':>11}{'B/A':>8}  note"
    lines = [f"A = {label_a}, B = {label_b}; medians over each run's profiled steps", head, "-" * len(head)]
    last = None
    for r in table[table["note"] != "same"].to_dict("records"):
        stage = r["stage"] if r["stage"] != last else ""
        last = r["stage"]
        if not r["number"]:
            lines.append(f"{stage:<13}{'(' + r['note'] + ': not compared)':<24}")
            continue
        ratio = "–" if r["ratio"] != r["ratio"] else f"{r['ratio']:.2f}"
        a, b, delta = (number_text(r[k]) for k in ("A", "B", "delta"))
        sign = "+" if r["delta"] > 0 else ""
        lines.append(f"{stage:<13}{r['number']:<24}{a:>10}{b:>10}{sign + delta:>11}{ratio:>8}  {r['note']}")
    lines += textwrap.wrap(same_text(table), 120)
    if any(str(n).endswith("*") for n in table["number"]):
        lines.append(STARRED)
    return "\n".join(lines)
