"""The report: an HTML page and PNG plots in the run folder, the answer first.

1. **the verdict** (:mod:`minddp.analysis.verdict`): the stages ranked by non-compute time and by step
   time, each with its spread over the profiled steps and one sentence saying why, and what the numbers
   mean (on a CPU too); the same block the console prints (:mod:`minddp.analysis.blocks`);
2. ``bucket_timeline.png``, right under it: one step of rank 0 of every stage, torch's DDP included, on
   **one** time axis: each micro-batch's forward and backward, each bucket's hand-over and collective, the
   optimizer step (docs/analysis.md, "One step on one time axis", says how to read it);
3. ``temporal_breakdown.png``: per stage, stacked compute / non-compute / idle share (HTA's temporal breakdown);
4. ``overlap.png``: per stage, the overlap (the share of communication time with compute beside it), with its
   spread over the steps;
5. ``comm.png``: per stage, collective calls per step by kind, and communication in flight per step;
6. ``report.html``: all of it, a caption under every figure saying what to look for, then the tables. Every
   name taken from the file system (a run's, a stage's, an image's) reaches the page escaped, an image's
   address percent-encoded.

With two runs (``--compare``) the page opens with what changed (settings, and one table of A, B, Δ and
B/A: :mod:`minddp.analysis.compare`, the block the console prints) and the bar plots show both runs side by
side. Every figure is at most 1100 px wide and the page scales it to the window, so none is cut at any width.

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
from urllib.parse import quote

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from minddp.analysis.blocks import html_lines  # noqa: E402
from minddp.analysis.compare import changes_block  # noqa: E402
from minddp.analysis.names import HEADERS, KINDS, MEASURES, stage_sort_key  # noqa: E402
from minddp.analysis.timeline import draw_steps, rows_from_analysis  # noqa: E402
from minddp.analysis.verdict import stage_spread, verdict_block  # noqa: E402

_COLORS = {"compute": "#4c72b0", "non_compute": "#dd8452", "idle": "#c7c7c7"}
#: The widest figure, in inches at 100 dpi: 1100 px, inside a 1280 px window with the page's margins.
MAX_WIDTH_IN = 11.0


def _stage_labels(results) -> list[str]:
    names = {s for r in results for s in r.stages.index}
    return sorted(names, key=stage_sort_key)


def _width(stages, results, per_bar: float = 0.9) -> float:
    return min(MAX_WIDTH_IN, max(7.0, 1.5 + per_bar * len(stages) * len(results)))


def _offsets(results, stages):
    width = 0.8 / len(results)
    return width, [[j + (i - (len(results) - 1) / 2) * width for j in range(len(stages))] for i in range(len(results))]


def _legend_below(ax, ncol: int) -> None:
    """The legend under the axis, inside the figure (never beside it, where a page would cut it off)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=ncol, fontsize=8, frameon=False)


def plot_temporal(results, path: Path) -> None:
    """Step 3."""
    stages = _stage_labels(results)
    fig, ax = plt.subplots(figsize=(_width(stages, results), 4.4))
    width, xs = _offsets(results, stages)
    for i, r in enumerate(results):
        bottom = [0.0] * len(stages)
        for part in ("compute", "non_compute", "idle"):
            vals = [r.stages[f"{part}_pctg"].get(s, 0.0) for s in stages]
            label = {"compute": "compute", "non_compute": "non-compute (in flight, nothing computing)", "idle": "idle"}
            ax.bar(
                xs[i],
                vals,
                width,
                bottom=bottom,
                color=_COLORS[part],
                edgecolor="white",
                label=label[part] if i == 0 else None,
                hatch="//" if i else None,
            )
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(stages)), stages, rotation=20)
    ax.set_ylabel("% of the profiled steps' time")
    ax.set_ylim(0, 100)
    runs = " vs ".join(r.run + (" (hatched)" if i else "") for i, r in enumerate(results))
    ax.set_title(f"Where the profiled time went, per stage: {runs}", fontsize=10)
    _legend_below(ax, 4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _spread(result, column: str, factor: float = 1.0):
    """Per stage of ``result``: (median, min, max) of a per-step number over the profiled steps."""
    spread = stage_spread(result, [column])
    return {s: tuple(spread.loc[s, (column, k)] * factor for k in ("median", "min", "max")) for s in spread.index}


def _bars_with_spread(ax, results, stages, column: str, factor: float = 1.0) -> None:
    """Medians over the profiled steps, whiskers from the least to the most of them; one bar per run."""
    width, xs = _offsets(results, stages)
    for i, r in enumerate(results):
        sp = _spread(r, column, factor)
        nan = (float("nan"),) * 3
        med = [sp.get(s, nan)[0] for s in stages]
        err = [
            [m - sp.get(s, nan)[1] for s, m in zip(stages, med)],
            [sp.get(s, nan)[2] - m for s, m in zip(stages, med)],
        ]
        ax.bar(xs[i], med, width, yerr=err, capsize=3, label=r.run, hatch="//" if i else None, edgecolor="white")
    ax.set_xticks(range(len(stages)), stages, rotation=20)


def plot_overlap(results, path: Path) -> None:
    """Step 4: the median over the profiled steps of each step's overlap, and its spread (min–max)."""
    stages = _stage_labels(results)
    fig, ax = plt.subplots(figsize=(_width(stages, results), 4.2))
    _bars_with_spread(ax, results, stages, "overlap_pctg")
    ax.set_ylabel("overlap (% of the time in flight\nwith compute beside it)")
    ax.set_ylim(0, 100)
    ax.set_title("Overlap per stage: median of the profiled steps (whiskers: least to most)", fontsize=10)
    if len(results) > 1:
        _legend_below(ax, len(results))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_comm(results, path: Path) -> None:
    """Step 5: calls per step, stacked by kind (each run its own bar), above communication in flight per step."""
    stages = _stage_labels(results)
    fig, (a, b) = plt.subplots(2, 1, figsize=(_width(stages, results), 7.4))
    width, xs = _offsets(results, stages)
    for i, r in enumerate(results):
        bottom = [0.0] * len(stages)
        for kind in KINDS:
            vals = [r.stages[f"{kind.key}_calls_per_step"].get(s, 0.0) for s in stages]
            label = kind.label if i == 0 else None
            a.bar(xs[i], vals, width, bottom=bottom, color=kind.color, label=label, hatch="//" if i else None)
            bottom = [x + v for x, v in zip(bottom, vals)]
    a.set_xticks(range(len(stages)), stages, rotation=20)
    a.set_ylabel("calls per profiled step")
    runs = "" if len(results) == 1 else f" ({results[1].run} hatched)"
    a.set_title(f"Collective calls per step, by kind{runs}", fontsize=10)
    _legend_below(a, 3)
    _bars_with_spread(b, results, stages, "comm_time_us", MEASURES["comm_time_us"][1])
    b.set_ylabel(HEADERS["comm_time_per_step_us"])
    b.set_title("Communication in flight per step: median (whiskers: least to most of the steps)", fontsize=10)
    if len(results) > 1:
        _legend_below(b, len(results))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_timeline(result, path: Path | None = None, rank: int = 0):
    """Step 4: every stage's last profiled step on one shared time axis; the Figure (None if no CPU timeline).

    Drawn by :func:`minddp.analysis.timeline.draw_steps`, the one step
    picture of the package; each stage's backward spans are rectangles whose
    ``gid`` is ``backward:<stage>`` (one per micro-batch), so the figure can
    be checked as well as looked at.
    """
    rows = rows_from_analysis(result, rank)
    if not rows:
        return None
    step = int(result.phases["step"].iloc[0])
    fig = draw_steps(
        rows,
        title=f"One step of each stage, on one time axis: run {result.run} (profiled step {step}, rank {rank})",
        width=MAX_WIDTH_IN,
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
    """``comm_time_per_step_us`` -> (``comm in flight per step (ms)``, 1e-3): the header to print and the factor; a
    measure's column is named by its measure (:data:`~minddp.analysis.names.HEADERS`)."""
    for ending, (unit, factor) in UNITS.items():
        if column.endswith(ending):
            return HEADERS.get(column, column[: -len(ending)].replace("_", " ") + unit), factor
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


#: What to look for in each figure: the caption printed under it.
CAPTIONS = {
    "bucket_timeline": (
        "Where the orange bars (messages on the wire) sit against the blue backward bands is the story: inside "
        "them, communication runs beside backward (bucket-async, ddp, torch; the sharded stages' gathers); after "
        "them, the step waits (simple after every micro-batch, ga after the last); the black tick is when a "
        "bucket was handed to the wire, the vertical line the step's end. The stages were profiled one after "
        "another: compare shapes, and read the forward bands (the same work everywhere) for how much the "
        "machine's speed moved between them."
    ),
    "temporal_breakdown": (
        "Blue is the training thread inside aten ops; orange a message in flight while nothing computes (the "
        "non-compute time of the verdict, as a share); grey neither: on a CPU, the Python around the ops "
        "(hooks, the optimizer's loop, the autograd engine) and waits with no message in flight. single's grey "
        "is that Python: it has no communication at all."
    ),
    "overlap": (
        "Overlap: the share of each stage's time in flight with compute beside it, the median of its profiled "
        "steps; the whisker runs from the least to the most of them. On a CPU it measures who got a core as much "
        "as the stage's design: rank two stages only where their whiskers do not overlap. On a GPU it is the blog's "
        "overlap (NCCL kernels under compute kernels)."
    ),
    "comm": (
        "Top: collective calls per step by kind. Buckets cut the all_reduce calls (hook to bucket), accumulation "
        "divides them by the micro-batches (simple to ga), the sharded stages add all_gathers, and on gloo their "
        "reduce-scatters run as all_reduces of the whole bucket. Bottom: time with a message in flight per step, "
        "not bytes on a wire: on a CPU it includes waiting for the other rank and for a core."
    ),
}

_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:1180px} img{max-width:100%;height:auto;display:block}"
    " figure{margin:1em 0 2em 0} figcaption{font-size:14px;color:#333;max-width:1100px}"
    " table{border-collapse:collapse;font-size:13px;margin-bottom:1em} td,th{border:1px solid #ccc;padding:3px 6px}"
    " td{text-align:right;white-space:nowrap} td.text,th.text{text-align:left} .why{text-align:left;white-space:normal}"
    " tr.noise td{color:#888} .headline{font-size:16px} .cpu{color:#555;font-size:13px}"
    " .scroll{overflow-x:auto;max-width:100%}"
)


def _doc_link(name: str) -> str:
    """``docs/<name>`` as a link to the file where the docs are installed beside the package, else as text."""
    path = Path(__file__).resolve().parents[2] / "docs" / name
    label = f"docs/{name}"
    return f"<a href='{path.as_uri()}'>{label}</a>" if path.exists() else label


def _doc_links() -> dict[str, str]:
    return {"docs/analysis.md": _doc_link("analysis.md")}


def _figure(name: str, key: str) -> str:
    """An image of the page: its address percent-encoded (a run's name, from a folder, may hold a quote or a
    space), its alternative text escaped."""
    return (
        f"<figure><img src='{html.escape(quote(name))}' alt='{html.escape(name)}'>"
        f"<figcaption>{html.escape(CAPTIONS[key])}</figcaption></figure>"
    )


def _table_html(table, index: bool = True) -> str:
    """A table for reading (units in the headers), one header row, whole numbers shown whole."""
    out = readable(table).round(3)
    if index:
        out = out.reset_index()
    for column in out.columns:
        if column == "steps" or str(column).endswith("calls per step") or column == "rank":
            if out[column].dropna().apply(float.is_integer if out[column].dtype.kind == "f" else bool).all():
                out[column] = out[column].astype("Int64")
    return f"<div class='scroll'>{out.to_html(index=False)}</div>"


def write_report(results, folder) -> Path:
    """Steps 1-6 into ``folder``; returns the HTML page's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    timelines = []
    for r in results:
        name = "bucket_timeline.png" if len(results) == 1 else f"bucket_timeline_{r.run}.png"
        fig = plot_timeline(r, folder / name)
        if fig is not None:
            plt.close(fig)
            timelines.append(name)
    for name, plot in (
        ("temporal_breakdown.png", plot_temporal),
        ("overlap.png", plot_overlap),
        ("comm.png", plot_comm),
    ):
        plot(results, folder / name)
    title = "minddp trace analysis: " + " vs ".join(r.run for r in results)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    links = _doc_links()
    if len(results) == 2:
        parts += html_lines(changes_block(*results), links)
    for r in results:
        parts += html_lines(verdict_block(r), links)
    parts.append("<h2>One step of every stage, on one time axis</h2>")
    parts += [_figure(name, "bucket_timeline") for name in timelines]
    for name, heading in (
        ("temporal_breakdown", "Where the time went"),
        ("overlap", "Overlap: how much of the communication had compute beside it"),
        ("comm", "What was sent"),
    ):
        parts += [f"<h2>{heading}</h2>", _figure(f"{name}.png", name)]
    parts.append(
        f"<h2>The numbers</h2><p>Definitions: {_doc_link('analysis.md')}. Times in ms, bytes in MiB, shares in % "
        "(of the profiled steps' time, or of communication time for overlap), each in its column's header; "
        "every number here is over the <b>profiled</b> steps (the train command's summary gives the median of "
        "<b>all</b> steps, unprofiled, so it differs).</p>"
    )
    for r in results:
        parts += [f"<h3>Stages side by side: {html.escape(r.run)} (means over ranks)</h3>", _table_html(r.stages)]
    for r in results:
        parts += [f"<h3>Per rank: {html.escape(r.run)}</h3>", _table_html(r.summary, index=False)]
        if not r.kernels.empty:
            parts += [f"<h3>Kernel-type breakdown: {html.escape(r.run)}</h3>", _table_html(r.kernels, index=False)]
    parts.append("</body></html>")
    page = folder / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    if len(results) == 1:
        readable(results[0].stages).to_csv(folder / "stages.csv")  # the wide table the console leaves out
    return page
