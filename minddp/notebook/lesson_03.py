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
    words: its all_gather returns only once every rank has joined it, so the difference is the earlier rank's wait.
    ``spans``: rank 0's checks (ms); over several checks, the net difference is not one rank's wait.
    Call on every rank; rank 0 says it."""
    order = sorted(range(len(on_ranks)), key=on_ranks.__getitem__)
    long, short = order[-1], order[0]
    ranks = " and ".join(f"rank {r} {ms:.0f} ms" for r, ms in enumerate(on_ranks))
    if len(spans) > 1:
        ranks += f", over {len(spans)} checks"
    gap = round(on_ranks[long]) - round(on_ranks[short])  # of the whole ms printed, so that the sum adds up
    first = stage == CHECKED[0]  # why the ranks differ is said once, at the first stage checked
    why = (
        "Its all_gather returns only once both ranks have joined it (a rank slowed by the machine's load joins "
        "late), so "
        if first
        else ""
    )
    if gap == 0:
        told = "here the ranks' times differ by less than 1 ms."
    elif len(spans) == 1:
        told = f"rank {long}, there first, stood {gap:.0f} ms longer, waiting for rank {short}."
    else:  # a net over the checks: at each, either rank may have been there first
        told = "at each, the rank there first waited for the other."
    said = f"{stage}'s check held {ranks}. " + (why + told if first else told[0].upper() + told[1:])
    say(said)


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


def say_sweep(swept: dict, this_run_s: float) -> None:
    """The cap sweep's model in a sentence: its compute is one backward, ``this_run_s``, and the measured steps' own
    backwards (less the check) span a range around it (their link after backward: :func:`sweep_table`)."""
    own = {c: backward_less_check(v) for c, v in swept.items()}
    median_of = [cap_name(c) for c, b in own.items() if abs(b / 1e3 - this_run_s) < 1e-9]
    say(
        f"The step-time model replays every cap with one backward's compute, {1e3 * this_run_s:.0f} ms (their median"
        + (f": the {median_of[0]} step's own" if median_of else "")
        + f"; the steps' own: {min(own.values()):.0f} to {max(own.values()):.0f} ms)."
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
        "(exposed and waited: the table)",
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


def say_takeaway(per_grad: dict, bucketed: dict, saved_ms: float, backward_ms: dict, t4: dict, far: dict, waited: dict):
    """The takeaway in words, from the runs: what buckets saved on the link, how bucket-async's link time on this
    notebook's link compares with its own backward (``backward_ms``: each stage's backward less the check there), and
    which exposed less, bucket-async or hook-async, on each link (``t4``, ``far``: the sized links' runs), with the
    two steps' backwards where they differ by more than the exposed times do; ``waited``: each stage's waited on this
    notebook's link, given where it orders the two the other way round."""
    b_ms, link = backward_ms["bucket-async"], bucketed["link_ms"]
    said = (
        f"Buckets cut the link time by the fixed costs of the messages they no longer send: {saved_ms:.1f} ms of "
        f"hook-async's {per_grad['link_ms']:.0f} ms here."
    )
    if link >= 0.9 * b_ms and round(bucketed["end_ms"], 1) > 0:  # within a tenth, or longer: said so, not one message
        size = "about as long as" if link <= 1.1 * b_ms else "longer than"
        said += (
            f" On the link bucket-async's messages took {size} its own backward ({link:.0f} against {b_ms:.0f} ms) "
            f"and ran {bucketed['end_ms']:.1f} ms past its end."
        )
    word = {"as much as": "as much", "more than": "more", "less than": "less"}
    here = dict(per_grad, backward_ms=backward_ms["hook-async"]), dict(bucketed, backward_ms=b_ms)
    verdicts, apart = [], False
    for where, (h, b) in (
        ("on this notebook's link", here),
        ("sized for 4 × T4", (t4["hook-async"], t4["bucket-async"])),
        ("sized for 1024 ranks", (far["hook-async"], far["bucket-async"])),
    ):
        said_of = word[lesson.than(b["exposed_ms"], h["exposed_ms"])]
        numbers = f"{b['exposed_ms']:.0f} {'and' if said_of == 'as much' else 'against'} {h['exposed_ms']:.0f} ms"
        gap = abs(round(b["exposed_ms"]) - round(h["exposed_ms"]))
        if abs(round(b["backward_ms"]) - round(h["backward_ms"])) > gap:  # unequal compute: the steps' backwards
            numbers += f"; backwards {b['backward_ms']:.0f} against {h['backward_ms']:.0f} ms"
            apart = True
        if where == "on this notebook's link":
            w_b, w_h = round(waited["bucket-async"]), round(waited["hook-async"])
            by_exposed = round(b["exposed_ms"]) - round(h["exposed_ms"])
            if by_exposed * (w_b - w_h) < 0:  # the two measures order the stages oppositely
                numbers += f"; waited, the other way round: {w_b} against {w_h} ms"
        verdicts.append(f"{said_of} {where} ({numbers})")
    said += f" Exposed at each link's own cap, bucket-async against hook-async: {', '.join(verdicts)}"
    said += (
        ": where the backwards are given they differ by more than the exposed times, so those steps do not compare "
        "the links on equal compute."
        if apart
        else "."
    )
    say(said)
