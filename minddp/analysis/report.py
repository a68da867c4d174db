"""The report: an HTML page and PNG plots in the run folder.

1. ``temporal_breakdown.png``: per stage, stacked compute / non-compute / idle
   share of the profiled time (HTA's temporal breakdown);
2. ``overlap.png``: per stage, the share of comm hidden behind compute;
3. ``comm.png``: per stage, all_reduce calls per step and comm time per step;
4. ``bucket_timeline.png``: for one step of rank 0 of each stage, a row per
   bucket: a tick when it became ready, a thin bar while the hook launched it,
   a thick bar while its all_reduce ran. Bars that start before the step's
   backward ends are the overlap;
5. ``report.html``: the side-by-side table, the plots, and the per-rank table.

With two runs (``--compare``) the bar plots show both runs' bars side by side.

Example::

    >>> write_report([analyze_run("traces/demo")], "traces/demo")
    PosixPath('traces/demo/report.html')
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
            ax.bar(xs, vals, width, bottom=bottom, color=_COLORS[part], edgecolor="white",
                   label=part.replace("_", "-") if i == 0 else None, hatch="//" if i else None)
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
    _grouped_bars(a, results, stages, "allreduce_calls_per_step", "all_reduce calls per step")
    a.set_title("all_reduce calls per step")
    results_ms = [_scaled(r, "comm_time_per_step_us", 1e-3) for r in results]
    _grouped_bars(b, results_ms, stages, "comm_time_per_step_us", "ms per step")
    b.set_title("Communication time per step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _scaled(result, column, factor):
    from copy import copy
    out = copy(result)
    out.stages = result.stages.assign(**{column: result.stages[column] * factor})
    return out


def plot_buckets(result, path: Path, rank: int = 0) -> bool:
    """Step 4: the per-bucket timeline of one step, one panel per stage. False if no buckets."""
    if result.buckets.empty:
        return False
    data = result.buckets[result.buckets["rank"] == rank]
    stages = [s for s in _stage_labels([result]) if s in set(data["stage"])]
    fig, axes = plt.subplots(len(stages), 1, figsize=(10, 1.0 + 1.6 * len(stages)), squeeze=False)
    for ax, stage in zip(axes[:, 0], stages):
        d = data[data["stage"] == stage].sort_values("order")
        ys = list(range(len(d)))
        ms = 1e-3
        ax.barh(ys, (d["launched_us"] - d["ready_us"]) * ms, left=d["ready_us"] * ms, height=0.3,
                color="#8172b3", label="hook launching")
        ax.barh(ys, (d["comm_end_us"] - d["comm_start_us"]) * ms, left=d["comm_start_us"] * ms, height=0.7,
                color="#dd8452", alpha=0.8, label="all_reduce running")
        ax.plot(d["ready_us"] * ms, ys, "k|", markersize=10, label="bucket ready")
        ax.axvline(d["step_end_us"].iloc[0] * ms, color="grey", ls="--", lw=1, label="step end")
        ax.set_yticks([])
        ax.invert_yaxis()  # first bucket on top, as time runs down the backward pass
        ax.set_ylabel(f"{stage}\n{len(d)} buckets", rotation=0, ha="right", va="center", fontsize=9)
        ax.set_xlim(0, d["step_end_us"].iloc[0] * ms * 1.02)
    axes[-1, 0].set_xlabel(f"ms since the start of step {int(data['step'].iloc[0])} (rank {rank})")
    axes[0, 0].legend(loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=7, ncol=4, frameon=False)
    fig.suptitle(f"When each bucket was ready, launched and reduced: run {result.run}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_report(results, folder) -> Path:
    """Steps 1-5 into ``folder``; returns the HTML page's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images = []
    for name, plot in (("temporal_breakdown.png", plot_temporal), ("overlap.png", plot_overlap),
                       ("comm.png", plot_comm)):
        plot(results, folder / name)
        images.append(name)
    for r in results:
        name = "bucket_timeline.png" if len(results) == 1 else f"bucket_timeline_{r.run}.png"
        if plot_buckets(r, folder / name):
            images.append(name)
    title = "minddp trace analysis: " + " vs ".join(r.run for r in results)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:13px}"
             " td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             "<p>Metric definitions: docs/analysis.md. Times in microseconds, shares in % of profiled time.</p>"]
    for r in results:
        parts += [f"<h2>Stages side by side: {html.escape(r.run)}</h2>", r.stages.round(2).to_html()]
    parts += [f"<h2>{html.escape(img[:-4].replace('_', ' '))}</h2><img src='{img}' alt='{img}'>" for img in images]
    for r in results:
        parts += [f"<h2>Per rank: {html.escape(r.run)}</h2>", r.summary.round(2).to_html(index=False)]
        if not r.kernels.empty:
            parts += [f"<h2>Kernel-type breakdown: {html.escape(r.run)}</h2>", r.kernels.round(2).to_html(index=False)]
    parts.append("</body></html>")
    page = folder / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
