"""Notebook 10 (slow links: local SGD, DiLoCo, streaming DiLoCo): the plumbing of its two figures, kept out of its
cells so that each cell shows its point.

- :func:`loss_against_steps_and_bytes`: the bench's mean expected loss over the seeds against the inner steps and
  against the payload bytes each replica handed to the all_reduce (``docs/diloco/convergence.json``), one line per
  run;
- :func:`streaming_steps`: the profiled row of streaming DiLoCo's inner steps (:func:`minddp.analysis.timeline.
  draw_steps`), each fragment's hand-over and apply marked with its step, each message bar named by its fragment,
  the waits drawn over the optimizer step, every message bar in the one light orange (named, they need no second
  shade, and the darker one is hard to tell from the red wait), and the legend by
  :func:`~minddp.analysis.timeline.legend_above`.
"""

from __future__ import annotations

import statistics


def mean_over_seeds(curves: dict, name: str, key: str) -> list[float]:
    """Run ``name``'s mean over its seeds at each score: ``key`` is ``"loss"`` or ``"bytes"``."""
    return [statistics.mean(v) for v in zip(*[c[key] for c in curves[name]])]


def loss_against_steps_and_bytes(results: dict, plotted: list[tuple[str, str]]):
    """The figure, two panels of each run of ``plotted`` (name, colour), its mean expected loss over the seeds,
    each a staircase: left against the inner steps, right against its mean payload bytes (log x; the 0-byte start
    left out); at each step (or payload), the run's last score by then (the loss is known only at the scores, every
    50 steps, so the line holds a score's loss until the next score, whether the run's weights changed at every
    step between, as DDP's, or only at a sync, so that a sync's change is drawn at its step, not as a ramp from the
    score before); dashed at H = 100 (streaming DiLoCo's too, as in ``docs/diloco/``'s figures); ``single``'s mean
    final loss and the entropy floor as horizontal lines; each y axis tall enough for every score it draws (none
    cut); the legend in the left panel's upper right, where no curve runs, and the right panel's title pointing to
    it. Returns the figure."""
    import matplotlib.pyplot as plt

    curves, floor = results["curves"], results["floor"]
    fig, (by_step, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.5))
    single = statistics.mean(c["loss"][-1] for c in curves["single"])
    tops = [0.0, 0.0]  # each panel's highest drawn score (nats): left, right
    for name, colour in plotted:
        losses, style = mean_over_seeds(curves, name, "loss"), "--" if "100" in name else "-"
        by_step.plot(curves[name][0]["step"], losses, color=colour, label=name, linestyle=style, drawstyle="steps-post")
        pts = [(b, lo) for b, lo in zip(mean_over_seeds(curves, name, "bytes"), losses) if b > 0]
        xs, ys = zip(*pts)
        by_bytes.plot(xs, ys, color=colour, label=name, linestyle=style, drawstyle="steps-post")
        tops = [max(tops[0], *losses), max(tops[1], *ys)]
    for ax, top in zip((by_step, by_bytes), tops):
        ax.axhline(single, color="0.5", linestyle="-.", linewidth=0.8, label="single: final (sends 0)")
        ax.axhline(floor, color="red", linestyle=":", linewidth=0.8, label="entropy floor")
        ax.set(ylabel="expected loss (nats)", ylim=(floor - 0.02, top + 0.03))
    by_step.set_xlabel("steps of each replica (inner steps, in the runs that talk rarely)")
    by_bytes.set(xscale="log", xlabel="payload bytes each replica handed to the all_reduce (log)")
    seeds = len(curves["ddp"])
    fig.suptitle(  # single, drawn too, is one replica
        f"{results['replicas']} replicas (single: 1), {results['steps']} steps, mean of {seeds} seeds", fontsize=9
    )
    by_step.legend(fontsize=8, loc="upper right")
    by_bytes.set_title("colours and line styles: the left panel's legend (dashed: H = 100)", fontsize=8)
    fig.tight_layout()
    return fig


def streaming_steps(row: dict, events: list, warm: int, title: str):
    """The figure of the profiled streaming DiLoCo run: ``row`` (``live.step_view(...)["row"]``) drawn by
    ``draw_steps``, each hand-over (a tall tick) and each apply (a triangle, where a ``minddp.fragment_apply`` event
    ends) labelled with its inner step, counted from ``warm`` + 1 (the first profiled step) by the
    ``minddp.optimizer_step`` events started by then; each message bar named by the fragment of the
    ``minddp.fragment_send#i`` event it follows (in time order); the waits drawn again over the optimizer step's
    green; the time axis from the first profiled forward; each step's forward and backward one bar (where the
    CPU's time splits between them varies from step to step, and no lesson rests on it); every message bar in the
    first message shade (the second, darker one removed). The legend above the axes names each kind once. Returns
    the figure."""
    from minddp.analysis.timeline import COLORS, draw_steps, legend_above

    t0 = min(e.time_range.start for e in events if e.name == "minddp.forward_backward")  # the row's 0 ms
    row = dict(row, forward=[], backward=[(f[0], b[1]) for f, b in zip(row["forward"], row["backward"])])

    def ms(t):
        return (t - t0) / 1e3

    applied = [ms(e.time_range.end) for e in events if e.name.startswith("minddp.fragment_apply")]
    started = [ms(e.time_range.start) for e in events if e.name == "minddp.optimizer_step"]

    def step_at(t):  # the inner step whose optimizer step (post-hook included) started last by t ms
        return warm + sum(s <= t for s in started)

    fig = draw_steps([row], title=title, width=11)
    ax = fig.axes[0]
    for bars in list(ax.collections):  # the second shade drawn over every other message: removed, one shade left
        if str(bars.get_gid()).startswith("messages_alt:"):
            bars.remove()
    for line in ax.get_lines():
        if line.get_label() == "handed to the wire":
            line.set(markersize=16, markeredgewidth=2)  # a tick tall enough to find
        if line.get_label() == "step ends":
            line.remove()  # the row's end: the optimizer step's end shows it
    ax.plot(applied, [-0.44] * len(applied), "v", color="black", markersize=6, label="fragment applied")
    for t in row["sent"]:
        ax.text(t - 1, 0.3, f"step {step_at(t)}", ha="right", va="center", fontsize=7)
    sends = sorted((e for e in events if e.name.startswith("minddp.fragment_send")), key=lambda e: e.time_range.start)
    for (start, _), send in zip(sorted(row["messages"]), sends):  # the i-th message is the i-th fragment sent
        fragment = send.name.rpartition("#")[2]
        ax.text(start + 1, 0.21, f"fragment {fragment}", ha="left", va="center", fontsize=7, zorder=4)
    for t in applied:
        ax.text(t - 2, -0.44, f"step {step_at(t)}", ha="right", va="center", fontsize=7)
    waits = [(s, e - s) for s, e in row["waits"]]  # inside an optimizer step: drawn again, over its green
    ax.broken_barh(waits, (-0.40, 0.40), facecolors=COLORS["wait"], zorder=3)
    ax.set_xlim(right=1.04 * ax.get_xlim()[1])  # room after the last step's marks
    ax.set_ylim(ax.get_ylim()[0], -0.62)  # room above the row for the apply triangles and their labels
    ax.set_xlabel(f"ms since step {warm + 1}'s forward started", fontsize=8)
    named = {"message on the wire": "message on the link (modeled)", "handed to the wire": "handed to the link",
             "backward": "forward and backward"}  # fmt: skip
    handles, labels = ax.get_legend_handles_labels()
    entries = {named.get(label, label): handle for label, handle in zip(labels, handles)}
    legend_above(ax, entries, 5)
    ax.set_title(ax.get_title(), fontsize=9, pad=30)  # above the legend's two lines
    fig.set_size_inches(11, 2.0)
    fig.tight_layout()
    return fig
