"""Notebook 04's helpers (``04_comm_hooks``): the hooks' names in sentences and the plumbing of its section on
messages against bytes (each preset's link time, the table, the figure), so that the section's cell shows its
two formulas, B* and n*, and what it claims of them.

``reduced``, below, is what one step of a hook's all_reduces reduce: ``(calls, payload bytes)``, from its traffic
meter (``trainee.metered[-1]``); the payload, not the bytes a rank sends.
"""

from __future__ import annotations

#: A hook's name in the notebook's sentences and tables (cell 0 gives the registry's name beside it).
NAMES = {"allreduce": "plain averaging", "fp16": "fp16", "bf16": "bf16", "powersgd": "PowerSGD"}


def link_ms(reduced: tuple[int, int], spec, n: int) -> float:
    """The *link time* (``metrics.link_time``) of one step's all_reduces ``reduced`` (``(calls, payload bytes)``) on
    the link ``spec`` (a :class:`~minddp.comm.link.LinkSpec`) and ``n`` ranks, ms. A message's α-β time is a fixed
    cost plus a price per byte, so the sum needs only the count and the bytes in all: here one message carries
    them all and the other ``calls - 1`` are empty, which adds the same ``calls`` fixed costs and price of bytes."""
    from minddp.analysis import metrics

    calls, nbytes = reduced
    return 1e3 * metrics.link_time(spec, [("all_reduce", nbytes, n)] + [("all_reduce", 0, n)] * (calls - 1))


def preset_table(reduced: dict, n: int, crossover):
    """One row per preset link (loopback left out): its α and bandwidth, each hook's link time for its step
    ``reduced[hook]`` (``allreduce`` and ``powersgd``), and ``crossover(α)``, B* in bytes/s, in Gbit/s."""
    import pandas as pd

    from minddp.comm.link import GBIT

    return pd.DataFrame.from_dict(
        {
            name: {
                "α per hop (µs)": spec.latency * 1e6,
                "bandwidth (Gbit/s)": spec.bandwidth / GBIT,
                **{f"{NAMES[h]}, link ms": link_ms(reduced[h], spec, n) for h in ("allreduce", "powersgd")},
                f"B* at the row's α, n = {n} (Gbit/s)": crossover(spec.latency) / GBIT,
            }
            for name, spec in presets().items()
        },
        orient="index",
    )


def where_shorter(table) -> str:
    """Which hook's messages take less link time on which presets, from :func:`preset_table`'s rows, each preset
    named with what it models (its ``about``), after a dash; a preset where the two differ by under 5% of the
    longer is marked about equal."""
    links = presets()
    psgd, plain = table["PowerSGD, link ms"], table["plain averaging, link ms"]
    faster = psgd < plain
    gap = (psgd - plain).abs() / psgd.combine(plain, max)

    def named(names) -> str:
        marks = {nm: " (about equal: within 5%)" if gap[nm] < 0.05 else "" for nm in names}
        return "; ".join(f"{nm} — {links[nm].about}{marks[nm]}" for nm in names) or "none"

    return (
        f"PowerSGD's messages take less link time on {named(table.index[faster])}. Plain averaging's on "
        f"{named(table.index[~faster])}"
    )


def presets() -> dict:
    """The preset links the section prices (:data:`minddp.comm.link.PRESETS` but ``loopback``, which has no
    network)."""
    from minddp.comm.link import PRESETS

    return {name: spec for name, spec in PRESETS.items() if name != "loopback"}


def link_figure(reduced: dict, n: int, link, crossover):
    """Plain averaging's and PowerSGD's link time per step against the bandwidth, 0.01 Gbit/s to 10 Tbit/s: a line
    each at ``link``'s α, a grey line at its B* (``crossover(α)``, bytes/s), and each preset as a marker at its
    own α and bandwidth, in its hook's colour, named beside its circle, a dotted line joining its two markers."""
    import matplotlib.pyplot as plt

    from minddp.comm.link import GBIT, LinkSpec

    links = presets()
    fig, ax = plt.subplots(figsize=(10, 4))
    bandwidths = [GBIT * 10 ** (e / 20) for e in range(-40, 81)]
    alpha = link.latency
    colors = {"allreduce": "#4c72b0", "powersgd": "#55a868"}
    for hook, color in colors.items():
        ax.plot(
            [bw / GBIT for bw in bandwidths],
            [link_ms(reduced[hook], LinkSpec("", bw, alpha), n) for bw in bandwidths],
            color=color,
            label=f"{NAMES[hook]}, {link.name}'s α = {alpha * 1e6:g} µs",
        )
    ax.axvline(crossover(alpha) / GBIT, color="grey", lw=0.8)
    ax.annotate(f" {link.name}'s B*, α = {alpha * 1e6:g} µs", (crossover(alpha) / GBIT, 3e2), fontsize=7, color="grey")
    ax.set(xscale="log", yscale="log", xlabel="bandwidth B (Gbit/s)", ylabel="link ms per step (modelled)")
    # each preset at its own α, not the lines' two; the circles larger, so that a triangle on one stays visible
    for hook, marker, size in (("allreduce", "o", 90), ("powersgd", "^", 30)):
        ax.scatter(
            [spec.bandwidth / GBIT for spec in links.values()],
            [link_ms(reduced[hook], spec, n) for spec in links.values()],
            marker=marker,
            s=size,
            facecolors="none",
            edgecolors=colors[hook],
            zorder=3,
            label=f"{NAMES[hook]}, each preset at its own α",
        )
    for i, (name, spec) in enumerate(links.items()):  # the name by the preset's own markers, not above the lines' α
        ax.plot(  # a preset's two markers share its B: joined, so that the triangle goes with the named circle
            [spec.bandwidth / GBIT] * 2,
            [link_ms(reduced[hook], spec, n) for hook in colors],
            color="grey",
            ls=":",
            lw=0.8,
            zorder=2,
            label="one preset's two markers (named at the circle)" if i == 0 else None,
        )
        ax.annotate(
            name,
            (spec.bandwidth / GBIT, link_ms(reduced["allreduce"], spec, n)),
            xytext=(7, 2),
            textcoords="offset points",
            fontsize=7,
        )
    ax.set_title(
        f"The last step's messages on n = {n} ranks: lines at {link.name}'s α, crossing at B*, "
        "markers at each preset's own α",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside: no marker hidden
    fig.tight_layout()
    plt.show()
