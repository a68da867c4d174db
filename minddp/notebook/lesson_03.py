"""Plumbing of notebook 03 (``notebooks/03_build_up``): the sentences its cells print, its tables and the cap
sweep's figure, built from the runs' values, so that each cell shows its point in a few lines.

Each function prints (or returns) words computed from the values it is handed, in the vocabulary of notebook 01
and ``docs/analysis.md`` (link time, exposed, waited, overlap). Each stage's numbers come from one profiled step
on cores shared with other work: the sentences rank the stages by what is counted or modeled (calls, bytes, the
link's times); a measured step's times are said as that step's (:func:`say_spread`: how much their backwards vary).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from minddp.notebook import lesson
from minddp.notebook.lesson import backward_less_check, say

#: The stages whose parameters-used check 03 reports, rank by rank (the ladder from simple; single sends nothing).
CHECKED = ("simple", "ga", "hook", "hook-async", "bucket", "bucket-async")


def checks_on_ranks(looks: dict, stages: list[str]) -> dict[str, list[float]]:
    """Each of ``stages``' time at the parameters-used check (ms, summed over the step's checks) on every rank, from
    every rank's own look. Call on every rank (an all_gather_object)."""
    mine = {s: looks[s]["check_ms"] for s in stages}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {s: [r[s] for r in everyone] for s in mine}


def say_check(stage: str, on_ranks: list[float], spans: list) -> None:
    """The time the parameters-used check held each rank in one step of ``stage`` (:func:`checks_on_ranks`), in
    words: its all_gather returns only once every rank has joined it, so the difference is how much longer the
    earlier rank was held. ``spans``: rank 0's checks (ms); over several checks, the net difference is not one
    rank's. Call on every rank; rank 0 says it."""
    order = sorted(range(len(on_ranks)), key=on_ranks.__getitem__)
    long, short = order[-1], order[0]
    said = f"{stage}'s check held " + " and ".join(f"rank {r} {ms:.0f} ms" for r, ms in enumerate(on_ranks))
    if len(spans) > 1:
        said += f", over {len(spans)} checks"
    gap = round(on_ranks[long]) - round(on_ranks[short])  # of the whole ms printed, so that the sum adds up
    if stage == CHECKED[0]:  # why the ranks differ is said once, at the first stage checked
        said += (
            ": its all_gather holds the rank there first until the other joins (a rank slowed by the machine's load "
            "joins late), a cost of the check, not of the link."
        )
    elif gap == 0:
        said += "; the ranks' times differ by less than 1 ms."
    elif len(spans) == 1:
        said += f": rank {long}, there first, was held {gap:.0f} ms longer, until rank {short} joined."
    else:  # a net over the checks: at each, either rank may have been there first
        said += "; at each, the rank there first was held until the other joined."
    say(said)


def say_still(stages: tuple[str, str], looks: dict) -> None:
    """Rank 0's standing still in one step of each of ``stages``: held at the check plus waited, and the two parts
    (rank 0's own looks; call on every rank, rank 0 says it)."""
    parts = {s: (round(looks[s]["check_ms"]), round(looks[s]["waited_ms"])) for s in stages}  # whole ms, as printed
    a, b = stages
    say(
        f"Rank 0 stood still {sum(parts[a])} ms in {a}, {parts[a][0]} held at the check and {parts[a][1]} waited, "
        f"against {sum(parts[b])} ms in {b} ({parts[b][0]} and {parts[b][1]})."
    )


def say_slow_forward(stage: str, v: dict) -> None:
    """If one forward of ``stage``'s step took over twice as long as each of its others (the same computation on
    batches of one size), say so: the extra time is the shared machine's, not the network's compute."""
    took = [e - s for s, e in v["row"]["forward"]]
    slow = max(range(len(took)), key=took.__getitem__)
    others = [t for i, t in enumerate(took) if i != slow]
    if others and took[slow] > 2 * max(others):
        say(
            f"{stage}'s forward {slow + 1} took {took[slow]:.0f} ms, its others "
            + " and ".join(f"{t:.0f}" for t in others)
            + f" ms: the same computation, so the extra is the shared machine's; {stage}'s bar is no compute baseline."
        )


def look_table(looks: dict, checks: dict[str, list[float]]):
    """The side-by-side table (:func:`minddp.notebook.lesson.look_table`) with the check's time on each rank."""
    table = lesson.look_table(looks).drop(columns="step, ms")  # one step's compute varies: no sentence uses it
    # the backward every later line quotes (backward_less_check), so that no reader subtracts two rounded columns
    table["last backward, ms"] = [round(backward_less_check(v)) for v in looks.values()]
    table = table.rename(
        columns={"last backward, ms": "last backward less the check, ms", "link time, ms (modeled)": "link time, ms"}
    )
    for r in range(len(next(iter(checks.values()), [0]))):
        table[f"at the check, ms, rank {r}"] = [round(checks[s][r]) if s in checks else "–" for s in looks]
    return table


def bucket_costs(looks: dict, per_message_ms: float, bare, plan) -> tuple[dict, object]:
    """The bucket lesson's first cell: hook-async's and bucket-async's links (``on_the_link`` of each step's row),
    the late start said from the bare network's timings (``bare``, :func:`minddp.costmodel.compute.probe`; ``plan``
    the workload's buckets). Returns (the links, their table)."""
    import pandas as pd

    from minddp.costmodel.buckets import on_the_link

    why = {s: on_the_link(looks[s]["row"]) for s in ("hook-async", "bucket-async")}
    filled = [max(bare.ready[i] for i in bucket) for bucket in plan]  # a bucket leaves when its last gradient is in
    first = min(range(len(plan)), key=filled.__getitem__)  # the bucket that fills first, not always the plan's first
    backward = 1e3 * bare.backward
    say(
        "Late start, on the bare network (no wrapper, no messages): the first gradient is ready after "
        f"{100 * 1e3 * min(bare.ready) / backward:.1f} % of the backward; bucket-async's first message, "
        + ("the plan's first bucket" if first == 0 else f"the plan's bucket {first + 1} of {len(plan)}")
        + f" ({len(plan[first])} gradients), after {100 * 1e3 * filled[first] / backward:.0f} %."
    )
    table = (
        pd.DataFrame(why)
        .T[["messages", "link_ms", "end_ms", "exposed_ms"]]
        .rename(columns={"link_ms": "link time, ms", "end_ms": "link after backward, ms", "exposed_ms": "exposed, ms"})
    )
    table = table.infer_objects()
    exposed = table["exposed, ms"].round().astype(int)  # whole ms from the measured value, as every other line
    table = table.round(1)
    table["exposed, ms"] = exposed
    return why, table


def cap_name(cap) -> str:
    return "None" if cap is None else f"{cap:g} MiB"


def say_sweep(swept: dict, this_run_s: float, model: list, default) -> None:
    """The cap sweep's steps against the model in a sentence: their own backwards (less the check) beside the model's
    one, ``this_run_s``, and each step's link after backward over the model's at its cap (``model``: the grid's
    :func:`~minddp.costmodel.buckets.plan_costs`, ``default``: None's), as a range."""
    from minddp.costmodel.buckets import on_the_link

    own = [backward_less_check(v) for v in swept.values()]
    at = {c.cap_mb: c for c in model} | {None: default}
    ratio = [on_the_link(v["row"])["end_ms"] / (1e3 * at[c].after_backward) for c, v in swept.items()]
    say(
        f"The steps' own backwards ran {min(own):.0f} to {max(own):.0f} ms against the model's "
        f"{1e3 * this_run_s:.0f}; their link after backward, {min(ratio):.2g} to {max(ratio):.2g} times the model's "
        "at their cap."
    )


def sweep_figure(swept: dict, model: list, default, per_gradient, link_name: str, world: int, here, h: dict):
    """The cap sweep's figure: the model's *link after backward* against the cap, beside each measured step's own
    link after backward (the same measure), and the three costs of each plan below. torch's default (None) has no
    cap on this axis: its measured and modeled points are drawn right of the grid, apart, each at a tick named None.
    ``h``: hook-async's look on the same link, its step's link after backward drawn beside the model's."""
    from matplotlib.ticker import NullLocator

    from minddp.costmodel.buckets import on_the_link
    from minddp.costmodel.figures import bucket_sweep

    measured = {c: on_the_link(v["row"])["end_ms"] for c, v in swept.items()}
    points = [
        (c, measured[c], "one step: link after backward, no warm-up step") for c in swept if c not in (here, None)
    ]
    points += [(here, measured[here], f"one step: link after backward, the workload's {here:g} MiB step")]
    points += [  # None, torch's default caps: drawn right of the grid, apart from each other and from the line
        (
            48,
            measured[None],
            f"one step: link after backward, cap None ({measured[None]:.0f} ms)",
        ),
        (
            64,
            1e3 * default.after_backward,
            f"step-time model: link after backward, None ({1e3 * default.after_backward:.0f} ms)",
        ),
    ]
    m_h = 1e3 * per_gradient.after_backward  # the model's, on the same one backward as its line (not a step's)
    h_end = on_the_link(h["row"])["end_ms"]  # hook-async's own step, beside the model's
    fig = bucket_sweep(
        {"step-time model: link after backward": model},
        measured=points,
        per_gradient={
            f"step-time model: link after backward, hook-async's ({m_h:.1f} ms)": m_h,
            f"one step: link after backward, hook-async's ({h_end:.1f} ms)": h_end,
        },
        title=f"bucket-async on {link_name}, {world} ranks: link after backward against the cap "
        "(each step on its own backward; exposed and waited: the table)",
    )
    fig.axes[0].set_ylabel("link after backward, ms")  # one step's, or the model's one backward's: not a rate
    ticks = [c.cap_mb for c in model]  # None's two points: one tick between them, named None, not a cap
    for ax in fig.axes:
        ax.xaxis.set_minor_locator(NullLocator())
    fig.axes[1].set_xticks([*ticks, (48 * 64) ** 0.5], [f"{c:g}" for c in ticks] + ["None"])
    return fig


def sweep_table(swept: dict, model: list, default):
    """The sweep's table: each plan's costs by the model, and the measured steps' link after backward, exposed,
    waited and backward less the check ("–" for a cap not run)."""
    import pandas as pd

    from minddp.costmodel.buckets import on_the_link

    def measured(c):
        v = swept.get(c)
        return {
            "link after backward, ms (one step)": on_the_link(v["row"])["end_ms"] if v else None,
            "exposed, ms (one step)": round(v["exposed_ms"]) if v else None,  # rounded once, as look_table does
            "waited, ms (one step)": round(v["waited_ms"]) if v else None,
            "backward less the check, ms (one step)": backward_less_check(v) if v else None,
        }

    table = pd.DataFrame({cap_name(c.cap_mb): c.row() | measured(c.cap_mb) for c in [*model, default]}).T
    table = table.rename(  # the vocabulary's name, as every other table; the first message is the earliest full bucket
        columns={
            "link, ms": "link time, ms",
            "first message ready, ms into the model's backward": (
                "first message (earliest full bucket) ready, ms into the model's backward"
            ),
        }
    )
    table = table.infer_objects().round(1).astype({"buckets": int})
    whole = ["exposed, ms (one step)", "waited, ms (one step)"]  # whole ms, as every other table and line prints them
    table[whole] = table[whole].astype("Int64")
    return table.astype(object).where(table.notna(), "–")  # "–": a cap not run


def median_backward_s(stage: str, model: str, steps: int = 3) -> float:
    """The median of ``steps`` profiled steps' last backwards of ``stage`` (one micro-batch, each step after a
    warm-up step of its own), seconds, this rank's."""
    return statistics.median(
        lesson.Trainee(stage, model=model, grad_accum=1).look()["last_backward_ms"] / 1e3 for _ in range(steps)
    )


def rank0s(value: float) -> float:
    """Rank 0's ``value`` on every rank (a broadcast): a timing every rank must build the same link from."""
    from minddp.runtime.device import message_device

    rank0 = torch.tensor([value], dtype=torch.float64, device=message_device())
    dist.broadcast(rank0, src=0)
    return rank0.item()


def say_sized(
    name: str,
    link,
    ranks: int,
    link_name: str,
    model_name: str,
    ratios: tuple,
    n_tensors: int,
    blog_tensors: int,
    sync_bytes: int,
    backward_s: float,
    how: str,
    cap: float,
) -> None:
    """One sized link, in a sentence: the setting's ratios, the network, the backward it was sized from, the link."""
    bytes_ratio, message_ratio = ratios
    say(
        f"{name}: on {link_name} with {ranks} ranks (step-time model) one sync's bytes take {bytes_ratio:.2f} "
        f"backwards, one message's fixed cost {message_ratio:.1e} of one. Here, on 2 ranks, {model_name}: {n_tensors} "
        f"gradient tensors (SmolLM2-360M {blog_tensors}), {sync_bytes / 2**20:.1f} MiB, a backward of "
        f"{1e3 * backward_s:.0f} ms ({how}, rank 0): an emulated link of {link.bandwidth / 1e9:.2g} GB/s and "
        f"{1e3 * link.latency:.3g} ms per hop; a cap of {cap:.2f} MiB."
    )


def say_sized_measures(t4: dict, far: dict) -> None:
    """Each sized link's rungs (2 ranks): link time,
    exposed and the step's own last backward less the check, then in words which exposed less, bucket-async or
    hook-async, and whether one message per gradient needed more link time than its own backward;
    a whole-ms match of bucket-async's backward on the two links is said to be chance (two networks, two steps)."""
    for name, runs in (("4 × T4", t4), ("1024 ranks", far)):
        h, b = runs["hook-async"], runs["bucket-async"]
        said = f"bucket-async exposed {lesson.than(b['exposed_ms'], h['exposed_ms'])} hook-async"
        if round(h["link_ms"]) > round(h["backward_ms"]):
            said += "; hook-async's link time is longer than its backward less the check"
        say(
            f"2 ranks on the link sized for {name}; each rung's link time, exposed and own last backward less the "
            "check, ms: "
            + "; ".join(
                f"{s} {r['link_ms']:.0f}, {r['exposed_ms']:.0f}, {r['backward_ms']:.0f}" for s, r in runs.items()
            )
            + f". {said}."
        )
    if round(t4["bucket-async"]["backward_ms"]) == round(far["bucket-async"]["backward_ms"]):
        say(
            f"bucket-async's backward, {t4['bucket-async']['backward_ms']:.0f} ms on both links, is the same whole ms "
            "by chance: two networks, two steps."
        )


def say_takeaway(per_grad: dict, saved_ms: float, far: dict) -> None:
    """The takeaway in words, from the runs: the link time buckets cut (the fixed costs of the messages they no
    longer send) on this notebook's link (``per_grad``: hook-async's, ``saved_ms``: the cut) and on the link sized
    for 1024 ranks (``far``: its runs), each as a share of hook-async's link time."""
    h, b = far["hook-async"]["link_ms"], far["bucket-async"]["link_ms"]
    here, there = 100 * saved_ms / per_grad["link_ms"], 100 * (h - b) / h
    say(
        f"Buckets cut the link time by the fixed costs of the messages they no longer send: {here:.0f} % of "
        f"hook-async's here ({saved_ms:.1f} of {per_grad['link_ms']:.0f} ms), {there:.0f} % on the link sized for "
        f"1024 ranks ({h - b:.0f} of {h:.0f} ms)"
        + (  # the verdict only where the runs bear it
            ". So buckets pay off in link time where the messages' fixed costs are "
            + ("most" if there > 50 else "a larger share")
            + " of it, as sized for many ranks."
            if there > here
            else "."
        )
    )
