"""The report: an HTML page and PNG plots in the run folder.

1. ``temporal_breakdown.png``: per stage, stacked compute / non-compute / idle share (HTA's temporal breakdown);
2. ``overlap.png``: per stage, the share of comm hidden behind compute;
3. ``comm.png``: per stage, collective calls per step (all_reduce, all_gather, reduce_scatter) and comm time per step;
4. ``bucket_timeline.png``: one step of rank 0 of every stage, torch's DDP included, on **one** time axis: each
   micro-batch's forward and backward, each bucket's hand-over and collective, the optimizer step
   (docs/analysis.md, "One step on one time axis", says how to read it);
5. ``report.html``: the side-by-side table, the plots, and the per-rank table.

With two runs (``--compare``) the bar plots show both runs' bars side by side.

Example (on one rank; the trace of a tiny run)::

    >>> import os, tempfile
    >>> from minddp.runtime.profiling import tiny_run
    >>> run = tempfile.TemporaryDirectory()                     # a run folder: one stage, one rank
    >>> _ = tiny_run(run.name)                                  # 3 steps, 2 recorded: a matmul, two all_reduces
    >>> from minddp.analysis import analyze_run
    >>> write_report([analyze_run(run.name)], run.name).name
    'report.html'
    >>> sorted(p for p in os.listdir(run.name) if p.endswith(".png"))
    ['bucket_timeline.png', 'comm.png', 'overlap.png', 'temporal_breakdown.png']
"""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = {"compute": "#4c72b0", "non_compute": "#dd8452", "idle": "#c7c7c7"}


def _stage_labels(results) -> list[str]:
    from minddp.analysis import stage_sort_key

    names = {s for r in results for s in r.stages.index}
    return sorted(names, key=stage_sort_key)


def _grouped_bars(ax, results, stages, column, ylabel):
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        values = [r.stages[column].get(s, float("nan")) for s in stages]
        xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(stages))]
        ax.bar(xs, values, width, label=r.run)
    ax.set_xticks(range(len(stages)), stages, rotation=20)
    ax.set_ylabel(ylabel)
    if len(results) > 1:
        ax.legend(fontsize=8)


def plot_temporal(results, path: Path) -> None:
    """Step 1."""
    stages = _stage_labels(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(stages) * len(results)), 4))
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(stages))]
        bottom = [0.0] * len(stages)
        for part in ("compute", "non_compute", "idle"):
            vals = [r.stages[f"{part}_pctg"].get(s, 0.0) for s in stages]
            ax.bar(
                xs,
                vals,
                width,
                bottom=bottom,
                color=_COLORS[part],
                edgecolor="white",
                label=part.replace("_", "-") if i == 0 else None,
                hatch="//" if i else None,
            )
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(stages)), stages, rotation=20)
    ax.set_ylabel("% of profiled time")
    ax.set_ylim(0, 100)
    runs = " vs ".join(r.run + (" (hatched)" if i else "") for i, r in enumerate(results))
    ax.set_title(f"Temporal breakdown per stage: {runs}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_overlap(results, path: Path) -> None:
    """Step 2."""
    stages = _stage_labels(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(stages)), 4))
    _grouped_bars(ax, results, stages, "comm_comp_overlap_pctg", "% of comm time under compute")
    ax.set_title("Computation-communication overlap per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_comm(results, path: Path) -> None:
    """Step 3."""
    stages = _stage_labels(results)
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(10, 2 * len(stages)), 4))
    calls = [
        _summed(r, ["allreduce_calls_per_step", "allgather_calls_per_step", "reducescatter_calls_per_step"])
        for r in results
    ]
    _grouped_bars(a, calls, stages, "collective_calls_per_step", "collective calls per step")
    a.set_title("all_reduce + all_gather + reduce_scatter calls per step")
    results_ms = [_scaled(r, "comm_time_per_step_us", 1e-3) for r in results]
    _grouped_bars(b, results_ms, stages, "comm_time_per_step_us", "ms per step")
    b.set_title("Communication time per step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summed(result, columns, name="collective_calls_per_step"):
    from copy import copy

    out = copy(result)
    present = [c for c in columns if c in result.stages.columns]
    out.stages = result.stages.assign(**{name: result.stages[present].sum(axis=1)})
    return out


def _scaled(result, column, factor):
    from copy import copy

    out = copy(result)
    out.stages = result.stages.assign(**{column: result.stages[column] * factor})
    return out


def plot_timeline(result, path: Path | None = None, rank: int = 0):
    """Step 4: every stage's last profiled step on one shared time axis; the Figure (None if no CPU timeline).

    Drawn by :func:`minddp.analysis.timeline.draw_steps`, the one step
    picture of the package; each stage's backward spans are rectangles whose
    ``gid`` is ``backward:<stage>`` (one per micro-batch), so the figure can
    be checked as well as looked at.
    """
    from minddp.analysis.timeline import draw_steps, rows_from_analysis

    rows = rows_from_analysis(result, rank)
    if not rows:
        return None
    step = int(result.phases["step"].iloc[0])
    fig = draw_steps(
        rows,
        title=f"One step of every stage, on one time axis: run {result.run} (profiled step {step}, rank {rank})",
        width=11,
    )
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


#: How a column's name ends -> (its unit in the header, the factor from the stored value). One format for every
#: table minddp prints: times in ms, bytes in MiB, shares in %, each unit in its column's header.
UNITS = {
    "_us": (" (ms)", 1e-3),
    "_pctg": (" (%)", 1.0),
    "_pct": (" (%)", 1.0),
    "_bytes_per_step": (" per step (MiB)", 2.0**-20),
    "_bytes": (" (MiB)", 2.0**-20),
}


def readable_name(column: str) -> tuple[str, float]:
    """``comm_time_per_step_us`` -> (``comm time per step (ms)``, 1e-3): the header to print and the factor."""
    for ending, (unit, factor) in UNITS.items():
        if column.endswith(ending):
            return column[: -len(ending)].replace("_", " ") + unit, factor
    return column.replace("_", " "), 1.0


def readable(table):
    """A copy of an analysis table for reading: ms, MiB and % with the unit in each header (the stored
    DataFrames keep their raw names and units: µs, bytes, as HTA's)."""
    out = table.copy()
    renames = {}
    for col in table.columns:
        name = col[0] if isinstance(col, tuple) else col
        if not isinstance(name, str):
            continue
        header, factor = readable_name(name)
        if factor != 1.0:
            out[col] = table[col] * factor
        renames[name] = header
    return out.rename(columns=renames, level=0 if isinstance(table.columns[0], tuple) else None)


def write_report(results, folder) -> Path:
    """Steps 1-5 into ``folder``; returns the HTML page's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images = []
    for name, plot in (
        ("temporal_breakdown.png", plot_temporal),
        ("overlap.png", plot_overlap),
        ("comm.png", plot_comm),
    ):
        plot(results, folder / name)
        images.append(name)
    for r in results:
        name = "bucket_timeline.png" if len(results) == 1 else f"bucket_timeline_{r.run}.png"
        fig = plot_timeline(r, folder / name)
        if fig is not None:
            plt.close(fig)
            images.append(name)
    title = "minddp trace analysis: " + " vs ".join(r.run for r in results)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:13px}"
        " td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>Metric definitions: docs/analysis.md. Times in ms, bytes in MiB, shares in % (of the profiled "
        "time, or of communication time for overlap), each in its column's header.</p>",
    ]
    for r in results:
        parts += [f"<h2>Stages side by side: {html.escape(r.run)}</h2>", readable(r.stages).round(3).to_html()]
    parts += [f"<h2>{html.escape(img[:-4].replace('_', ' '))}</h2><img src='{img}' alt='{img}'>" for img in images]
    for r in results:
        parts += [f"<h2>Per rank: {html.escape(r.run)}</h2>", readable(r.summary).round(3).to_html(index=False)]
        if not r.kernels.empty:
            parts += [
                f"<h2>Kernel-type breakdown: {html.escape(r.run)}</h2>",
                readable(r.kernels).round(3).to_html(index=False),
            ]
    parts.append("</body></html>")
    page = folder / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
