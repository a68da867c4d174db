"""Figures for the notebooks: the ladder on a slow link, measured and predicted.

From a run folder of ``python -m minddp.train --stage all --link <link>``: :func:`ladder_on_link`,
per stage, where the step's time goes (compute, non-compute: only communication running, idle) and its
overlap (the share of the communication with compute beside it: the blog's breakdown and overlap charts);
:func:`predicted_ladder`, per stage, the step the model predicts on each of several links beside the
measured one. :func:`bucket_sweep`: the model's link after backward against the bucket cap, measured points
(exposed, waited) beside it, with the three costs of a plan (:mod:`minddp.costmodel.buckets`) under it.
Every axis is named by the measure it shows (docs/analysis.md, "The measures"). Colours as in every step picture
(:mod:`minddp.analysis.timeline`): orange is communication, red the training thread waiting for it.

Example (on one rank; a tiny run with a link, profiled)::

    >>> import os, tempfile, json
    >>> from minddp.costmodel.trace import tiny_run_on_link
    >>> run = tempfile.TemporaryDirectory()
    >>> path = tiny_run_on_link(run.name, "1gbit")                # bucket-async, 3 steps, its messages on 1gbit
    >>> with open(os.path.join(run.name, "bucket-async", "config.json"), "w") as f:
    ...     json.dump({"stage": "bucket-async", "link": "1gbit"}, f)
    >>> from minddp.costmodel.figures import ladder_on_link, predicted_ladder
    >>> ladder_on_link(run.name).axes[0].get_title()
    'the ladder on 1gbit (measured)'
    >>> from minddp.analysis import analyze_run                   # analysed already: pass it, read the traces once
    >>> ladder_on_link(run.name, analysis=analyze_run(run.name)).axes[0].get_title()
    'the ladder on 1gbit (measured)'
    >>> fig = predicted_ladder(run.name, links=["100mbit", "1gbit", "10gbit"])
    >>> [t.get_text() for t in fig.axes[0].get_xticklabels()], len(fig.axes[0].patches)   # 2 bars a link
    (['bucket-async'], 6)
    >>> from minddp.costmodel.buckets import plan_costs
    >>> from minddp.costmodel.compute import ComputeProfile
    >>> cp = ComputeProfile(nbytes=[4_000_000] * 4, forward=0.02, backward=0.04, ready=[0.04, 0.03, 0.02, 0.01])
    >>> curve = [plan_costs(cp, "bucket-async", cap, "1gbit", 2) for cap in (1, 4, 8, 16)]
    >>> fig = bucket_sweep({"model": curve}, measured=[(4, 70.0, "measured")], per_gradient={"hook-async": 40.0})
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['ms per step', 'ms (log scale)']
"""

from __future__ import annotations

import json
from pathlib import Path


def _link_of(run: Path) -> str:
    for config in sorted(run.glob("*/config.json")):
        link = json.loads(config.read_text()).get("link")
        if link:
            return link
    return "no link"


def ladder_on_link(run, ax=None, analysis=None):
    """Stacked shares of the step (compute / non-compute / idle) per stage, the overlap on top. Returns the figure.

    ``analysis``: the run's :func:`~minddp.analysis.analyze_run` result, when the caller has it already
    (its traces are then not read a second time); ``run`` (the folder) still names the link.
    """
    import matplotlib.pyplot as plt

    from minddp.analysis import analyze_run

    run = Path(run)
    stages = (analysis if analysis is not None else analyze_run(run)).stages
    stages = stages.drop(index=[s for s in ("single",) if s in stages.index])
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * len(stages) + 2, 3.6))
    names = list(stages.index)
    bottom = [0.0] * len(names)
    for column, label, color in [
        ("compute_pctg", "compute", "#4c72b0"),
        ("non_compute_pctg", "non-compute: only communication running", "#dd8452"),
        ("idle_pctg", "idle", "#cccccc"),
    ]:
        values = list(stages[column])
        ax.bar(names, values, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, overlap in enumerate(stages["comm_comp_overlap_pctg"]):
        shown = "<1" if 0 < overlap < 1 else f"{overlap:.0f}"  # a measured share under 1 % is not a 0
        ax.annotate(f"{shown} %\noverlap", (x, 101), ha="center", va="bottom", fontsize=7)
    ax.set(ylim=(0, 118), xlabel="stage", ylabel="% of the step", title=f"the ladder on {_link_of(run)} (measured)")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax.figure


def predicted_ladder(run, links: list[str], ax=None):
    """Predicted step per stage on each link (from the run's profiled steps), and the run's own. Returns the figure."""
    import matplotlib.pyplot as plt

    from minddp.costmodel.runs import predict_run

    run = Path(run)
    rows = predict_run(run, links, [], real_network=False)
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    if ax is None:
        _, ax = plt.subplots(figsize=(1.3 * len(stages) + 2, 3.6))
    width = 0.8 / len(links)
    for j, link in enumerate(links):
        ys = [next(r["step_ms"] for r in rows if r["stage"] == s and r["link"] == link) for s in stages]
        exposed = [next(r["exposed_ms"] for r in rows if r["stage"] == s and r["link"] == link) for s in stages]
        xs = [i + (j - (len(links) - 1) / 2) * width for i in range(len(stages))]
        bars = ax.bar(xs, ys, width, label=f"{link} (predicted)")
        ax.bar(
            xs,
            exposed,
            width,
            bottom=[y - e for y, e in zip(ys, exposed)],
            color=bars.patches[0].get_facecolor(),
            hatch="//",
            edgecolor="white",
            linewidth=0,
        )
    ax.set_xticks(range(len(stages)), stages, rotation=30)
    ax.set(
        ylabel="step (ms); hatched: exposed",
        title=f"the same steps on other links (profiled on {_link_of(run)})",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax.figure


def bucket_sweep(curves: dict, measured=(), per_gradient: dict | None = None, title: str = ""):
    """The model's link after backward against the cap, with measured points (top; the axis is in ms, not named
    after one measure: the model's and the measured points' are different measures, which their labels name), and
    the three costs of each plan (below). Returns the figure.

    ``curves``: label -> [:class:`~minddp.costmodel.buckets.PlanCosts`, one per cap] (the first curve's costs
    are drawn below); ``measured``: ``(cap MiB, ms, label)`` points, or ``(cap MiB, ms, label, note)``, the note
    written beside the point (a measured step's own backward, say); one marker per label, each later label's smaller
    and drawn on top, so that points at one spot can be told apart; ``per_gradient``: label ->
    ms, drawn as horizontal lines (a stage without buckets has no cap).
    """
    import matplotlib.pyplot as plt

    fig, (top, low) = plt.subplots(2, 1, figsize=(14, 6.2), sharex=True, height_ratios=[3, 2])
    styles = ["-", "--", ":"]
    for (label, costs), style in zip(curves.items(), styles):
        top.plot(
            [c.cap_mb for c in costs], [1e3 * c.after_backward for c in costs], style, color="#d62728", label=label
        )
    markers: dict[str, str] = {}
    for cap, ms, label, *note in measured:
        first = label not in markers
        marker = markers.setdefault(label, "osD^v"[len(markers) % 5])
        kinds = list(markers).index(label)  # each later kind smaller and on top: points at one spot stay apart
        top.plot(
            [cap],
            [ms],
            marker,
            color="#d62728",
            mfc="white" if marker != "o" else "#d62728",
            ms=max(10 - 1.5 * kinds, 3.5),
            zorder=3 + kinds,
            label=label if first else None,
        )
        if note:
            top.annotate(note[0], (cap, ms), xytext=(6, 4), textcoords="offset points", fontsize=6, color="#555555")
    for (label, ms), style in zip((per_gradient or {}).items(), styles):
        top.axhline(ms, color="#555555", ls=style, lw=1, label=label)
    top.set(xscale="log", ylabel="ms per step")
    top.set_ylim(-0.03 * top.get_ylim()[1], None)  # a margin below 0: a point or a line at 0 stays in sight
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: it hides no point
    top.set_title(title, fontsize=9)
    costs = next(iter(curves.values()))
    caps = [c.cap_mb for c in costs]
    for values, label, color in [
        ([1e3 * c.fixed for c in costs], "fixed costs: buckets × 2(n−1)·α", "#8172b3"),
        (
            [1e3 * c.first_at for c in costs],
            "first message (earliest full bucket) ready, into the model's backward",
            "#4c72b0",
        ),
        ([1e3 * c.tail for c in costs], "last message's transfer", "#dd8452"),
    ]:
        low.plot(caps, values, "-", color=color, label=label)
    low.set(xlabel="bucket cap (MiB, log scale)", ylabel="ms (log scale)", yscale="log")
    low.set_xlim(right=1.6 * low.get_xlim()[1])  # the shared log axis: room right of the last point for its note
    low.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
