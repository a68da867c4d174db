"""One picture of a step, for every place that draws one: compute, each message, the waits, on one time axis.

A **step row** is a plain dict of spans in milliseconds from the step's start, from a trace file
(:func:`rows_from_analysis`) or a profiler in memory (:func:`minddp.analysis.live.step_view`):

* ``forward``, ``backward``: ``[(start, end), ...]``, one per micro-batch;
* ``messages``: while each collective ran, its waits for the other ranks and for a core included (on an
  emulated link: its modeled transfer, the legend's "message on the wire"); ``sent``: when each was handed
  to the wire; ``waits``: when the training thread stood still waiting for one; ``checks`` (optional): the spans of
  a check that is no message of the row's (the teaching stages' few-byte all_gather), as the caller times it (from
  the call to the gather's end, or gloo's range of it), drawn hatched over the top half of the band it falls in:
  in the waits' red, or, where the row sets ``checks_in_flight`` (the spans are gloo's ranges, held open included,
  not the thread's time), in the messages' orange;
* ``finish``, ``optimizer``: the spans of ``finish_gradient_synchronization()`` and ``optimizer.step()``;
* ``end``: when the step ended; ``label``: the row's name; ``stage``: names the drawn spans;
* ``link``: the emulated link's name, where the messages are its modeled transfers and the waits are known;
* ``wire`` (optional): the legend's name for the ``messages`` bars, where the row knows which ranges they are
  (:func:`rows_from_analysis`: the messages' all_reduce ranges only); by default "message on the wire" on a link,
  else "collective in flight (held open included)".

The messages' bars have no edge line, so that a bar is drawn no longer than its span (to a pixel). Messages open at
once (gloo's ranges of two collectives in flight together) are drawn in lanes, one above the other within the
band, each in the first lane free when it starts (:func:`lanes`), so that no bar is drawn over another and hides
it; within a lane the bars alternate two shades of orange, in the order they start, so that bars back to back are
told apart; the legend's swatch for them shows both shades.

:func:`draw_steps` draws rows one above the other on a shared axis (``faded=True``: pale), in the
colours every notebook shares (docs/analysis.md, "One step on one time axis"). :func:`row_sets` reads a row
as the interval sets the measures are defined on, and :func:`row_measures` gives its measures, each through
its one function in :mod:`minddp.analysis.metrics`.

Example::

    >>> row = {"label": "hook", "forward": [(0, 40)], "backward": [(40, 120)], "messages": [(60, 70)],
    ...        "sent": [60], "waits": [(60, 70)], "finish": [], "optimizer": [(121, 130)], "end": 130}
    >>> fig = draw_steps([row])
    >>> row_measures(row)["non_compute_ms"], row_measures(row)["interleaved_ms"]   # the wait inside backward
    (10.0, 10.0)
"""

from __future__ import annotations

from minddp.analysis import metrics
from minddp.analysis.names import stage_sort_key

COLORS = {
    "forward": "#deebf7",
    "backward": "#6baed6",
    "message": "#fd8d3c",
    "message_alt": "#e6550d",  # every second message bar of a row: bars back to back told apart without edge lines
    "wait": "#d62728",
    "finish": "#8172b3",
    "optimizer": "#55a868",
}


#: About the axis's width in pixels: a span shorter than ``axis_end(rows) / PIXELS`` is under a pixel wide.
PIXELS = 500


def axis_end(rows: list[dict]) -> float:
    """The right end (ms) of the time axis :func:`draw_steps` draws ``rows`` on."""
    return max([0.0, *(r.get("end", 0.0) for r in rows), *(e for r in rows for _, e in r.get("messages", []))])


def draw_steps(rows: list[dict], ax=None, title: str | None = None, width: float = 10.0):
    """Draw each row (module doc) on one axis, top to bottom; returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(width, 0.6 + 0.62 * len(rows)))
    right = axis_end(rows)
    for y, row in enumerate(rows):
        alpha, stage = 0.3 if row.get("faded") else 1.0, row.get("stage", row["label"])

        def bars(key, y0, h, color, row=row, y=y, alpha=alpha, stage=stage, **kw):
            spans = [(s, max(e - s, 0.0)) for s, e in row.get(key, [])]
            if sum(w for _, w in spans) < right / PIXELS:  # under a pixel wide in all: drawn, but not in the legend
                kw["label"] = "_" + kw.get("label", "")
            if not any(w >= right / PIXELS for _, w in spans):  # each under a pixel: an edge would hide the fill
                kw["linewidth"] = 0
            if spans:
                ax.broken_barh(spans, (y + y0, h), facecolors=color, alpha=alpha, **kw).set_gid(f"{key}:{stage}")

        bars("forward", -0.40, 0.40, COLORS["forward"], label="forward", edgecolor="#9ecae1", linewidth=0.4)
        bars("backward", -0.40, 0.40, COLORS["backward"], label="backward")
        bars("waits", -0.40, 0.40, COLORS["wait"], label="training thread waits")
        # the check over the band's top half only: the band it falls in (forward, backward or none) shows below it
        check = COLORS["message" if row.get("checks_in_flight") else "wait"]
        bars("checks", -0.40, 0.20, check, label="parameter check", hatch="xxxx", edgecolor="white")
        bars("optimizer", -0.40, 0.40, COLORS["optimizer"], label="optimizer step")
        bars("finish", -0.02, 0.06, COLORS["finish"], label="finish", zorder=3)  # above the ticks
        wire = row.get("wire") or (
            "message on the wire" if row.get("link") else "collective in flight (held open included)"
        )
        messages = sorted(row.get("messages", []))
        lane, n_lanes = lanes(messages)
        h = 0.30 / max(n_lanes, 1)
        for k in range(n_lanes):  # one lane in all unless messages overlap
            mine = [m for m, at in zip(messages, lane) if at == k]
            second = mine[1::2]  # every second by start within the lane, so bars back to back in it differ in shade
            label = wire if k == 0 else "_"
            bars("messages", 0.06 + k * h, h, COLORS["message"], row={"messages": mine}, label=label, linewidth=0)
            bars("messages_alt", 0.06 + k * h, h, COLORS["message_alt"], row={"messages_alt": second}, label="_",
                 linewidth=0)  # fmt: skip
        if row.get("sent"):
            ax.plot(
                row["sent"],
                [y + 0.05] * len(row["sent"]),
                "|",
                color="black",
                markersize=5,
                alpha=alpha,
                label="handed to the wire",
            )
        end = row.get("end", 0.0)
        ax.plot([end, end], [y - 0.45, y + 0.45], color="black", lw=1.2, alpha=alpha, label="step ends")
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), rows):
        tick.set_alpha(0.45 if row.get("faded") else 1.0)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    ax.set_xlim(0, right * 1.02 or 1.0)  # nothing cut off
    ax.set_xlabel("ms since the step started", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one entry per kind, not per row
    columns = min(len(unique), 8 if width >= 10 else 4)  # a narrow figure wraps its legend
    if sum(len(label) + 5 for label in list(unique)[:columns]) > 15 * width:  # a row past the figure's edge: two rows
        columns = -(-len(unique) // 2)
    legend = legend_above(ax, unique, columns)
    for handle in getattr(legend, "legend_handles", None) or getattr(legend, "legendHandles", []):
        handle.set_alpha(1.0)  # a kind drawn only in a faded row: its swatch in the row's full colour
    if title:
        ax.set_title(title, fontsize=9, pad=8 + 11 * -(-len(unique) // columns))
    ax.figure.tight_layout()
    return ax.figure


def lanes(spans: list[tuple[float, float]]) -> tuple[list[int], int]:
    """Each span's lane (in the order given) and the number of lanes: a span takes the lowest lane whose last span
    ended by its start, so spans in one lane never overlap, and spans that never overlap share lane 0.

    >>> lanes([(0, 10), (5, 8), (10, 12), (6, 20)])
    ([0, 1, 0, 2], 3)
    """
    ends: list[float] = []
    lane = []
    for start, end in spans:
        free = next((k for k, last in enumerate(ends) if last <= start), len(ends))
        if free == len(ends):
            ends.append(end)
        else:
            ends[free] = end  # the lane's last span ended by this one's start, so this one ends later
        lane.append(free)
    return lane, len(ends)


def legend_above(ax, entries: dict, columns: int):
    """A frameless legend of ``entries`` (label -> handle) in rows of ``columns`` just above the axes; where ``ax``
    draws a second shade of message bars, each message entry's swatch shows both shades, side by side."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.patches import Patch

    gids = [str(c.get_gid()) for c in ax.collections]
    if any(gid.startswith("messages_alt:") for gid in gids):
        entries = {
            label: (handle, Patch(facecolor=COLORS["message_alt"], linewidth=0))
            if str(getattr(handle, "get_gid", lambda: None)()).startswith("messages:")
            else handle
            for label, handle in entries.items()
        }
    return ax.legend(
        entries.values(),
        entries.keys(),
        loc="lower left",
        bbox_to_anchor=(0, 1.0),
        fontsize=7,
        ncol=columns,
        frameon=False,
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0)},
    )


def rows_from_analysis(result, rank: int = 0) -> list[dict]:
    """The rows of every stage of a :class:`~minddp.analysis.RunAnalysis` (its CPU timeline), one per stage."""
    phases, buckets = result.phases, result.buckets
    if phases.empty:
        return []
    phases = phases[phases["rank"] == rank]
    buckets = buckets[buckets["rank"] == rank] if not buckets.empty else buckets
    ms, rows = 1e-3, []
    for stage in sorted(set(phases["stage"]), key=stage_sort_key):
        p = phases[phases["stage"] == stage]
        b = buckets[buckets["stage"] == stage] if not buckets.empty else buckets

        def spans(phase, p=p):
            part = p[p["phase"] == phase]
            return [(s * ms, e * ms) for s, e in zip(part["start_us"], part["end_us"])]

        done = b.dropna(subset=["comm_start_us"]) if len(b) else b
        n = len(b)
        rows.append(
            {
                "stage": stage,
                "label": f"{stage}\n{n} message{'s' if n != 1 else ''}" if n else stage,
                "forward": spans("forward"),
                "backward": spans("backward"),
                "finish": spans("finish"),
                "optimizer": spans("optimizer"),
                "messages": [(s * ms, e * ms) for s, e in zip(done["comm_start_us"], done["comm_end_us"])]
                if len(done)
                else [],
                "sent": list(b["ready_us"] * ms) if n else [],
                "wire": "all_reduce range (held open included)",  # the check's and broadcasts' not drawn
                "end": float(p.loc[p["phase"] == "step", "end_us"].max()) * ms,
            }
        )
    return rows


def row_sets(row: dict) -> dict:
    """A step row's interval sets, in ms, as the measures read them (:mod:`minddp.analysis.metrics`):

    * ``window``: the step, from 0 to its end; ``comm``: its messages; ``backward``: its backward spans;
    * ``compute``: a forward, a backward or the optimizer, while the training thread is not waiting (for a
      message, or at a check);
    * ``waits`` and ``link`` (the messages, the link's modeled transfers) where the row is on a link
      (``row["link"]``), else None: a row of backend ranges does not know its waits.
    """
    waits = row.get("waits", [])
    on_link = bool(row.get("link"))
    return {
        "window": [(0.0, row.get("end", 0.0))],
        "compute": metrics.subtract(
            row["forward"] + row["backward"] + row.get("optimizer", []), waits + row.get("checks", [])
        ),
        "comm": metrics.merge(row.get("messages", [])),
        "backward": metrics.merge(row["backward"]),
        "waits": metrics.merge(waits) if on_link else None,
        "link": metrics.merge(row.get("messages", [])) if on_link else None,
    }


def row_measures(row: dict) -> dict:
    """The measures of one step row (ms, %), each by its function in :mod:`minddp.analysis.metrics`: ``in_flight_ms``,
    ``non_compute_ms``, ``overlap_pct``, ``interleaved_ms``, and on a link ``waited_ms`` and ``exposed_ms`` (NaN
    elsewhere). The messages' whole time counts, the part after the step's end too (a link still carrying)."""
    sets = row_sets(row)
    everything = [
        (min([0.0, *(s for s, _ in sets["comm"])]), max([row.get("end", 0.0), *(e for _, e in sets["comm"])]))
    ]
    nan = float("nan")
    return {
        "in_flight_ms": metrics.in_flight(sets["comm"]),
        "non_compute_ms": metrics.non_compute(everything, sets["compute"], sets["comm"]),
        "overlap_pct": metrics.overlap_pct(sets["comm"], sets["compute"]),
        "interleaved_ms": metrics.interleaved(sets["comm"], sets["compute"], sets["backward"]),
        "waited_ms": nan if sets["waits"] is None else metrics.waited(sets["waits"]),
        "exposed_ms": nan if sets["waits"] is None else metrics.exposed(sets["link"], sets["waits"]),
    }
