"""Plumbing of notebook 03 (``notebooks/03_build_up``): the sentences its cells print, its tables and the cap
sweep's figure, built from the runs' values, so that each cell shows its point in a few lines.

Each function prints (or returns) words computed from the values it is handed, in the vocabulary of notebook 01
and ``docs/analysis.md`` (link time, exposed, waited, overlap). Each stage's numbers come from one profiled step
on cores shared with other work: the sentences rank the stages by what is counted or modeled (calls, bytes, the
link's times); a measured step's times are said as that step's.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from minddp.notebook import lesson
from minddp.notebook.lesson import backward_less_check, listed, say

#: The backward each sized link was sized from, by setting: one name each, in every sentence that quotes it.
SIZED_FROM = {"4 × T4": "the sweep's median backward", "1024 ranks": "single's median backward of 3 steps"}
SETTING_NAMES = ("On 1 Gbit/s", "Sized for 4 × T4", "Sized for 1024 ranks")


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
    said = f"{stage}'s check held " + ", ".join(f"rank {r} {ms:.0f} ms" for r, ms in enumerate(on_ranks))
    if len(spans) > 1:
        said += f", over {len(spans)} checks"
    gap = round(on_ranks[long]) - round(on_ranks[short])  # of the whole ms printed, so that the sum adds up
    if gap == 0:
        said += "; the ranks' times differ by less than 1 ms."
    elif len(spans) == 1:
        said += f": rank {short} joined {gap:.0f} ms later."
    say(said if said.endswith(".") else said + ".")  # over several checks: the times only


def say_slow(stage: str, looks: dict) -> None:
    """A slow pass said, the shared machine's: for ``single``, one forward over twice each of its others (the same
    computation on batches of one size); for a later stage, its first backward, which syncs nothing in any stage,
    over 1.5 times single's."""
    v = looks[stage]
    if stage == "single":
        took = [e - s for s, e in v["row"]["forward"]]
        slow = max(range(len(took)), key=took.__getitem__)
        others = [t for i, t in enumerate(took) if i != slow]
        if others and took[slow] > 2 * max(others):
            say(
                f"single's forward {slow + 1} took {took[slow]:.0f} ms, its others "
                + " and ".join(f"{t:.0f}" for t in others)
                + " ms: the same computation, so the extra is the shared machine's; its bar is no compute baseline."
            )
        return
    first, base = ((lambda r: r["backward"][0][1] - r["backward"][0][0])(looks[s]["row"]) for s in (stage, "single"))
    if first > 1.5 * base:
        say(
            f"{stage}'s first backward, which syncs nothing, took {first:.0f} ms against single's {base:.0f}: the "
            "shared machine ran this step slower, its bars longer."
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


def against_quiet(sending: dict[str, float], quiet: dict[str, float | list[float]], where: str = "") -> str:
    """Last backwards (less the check) with messages inside them, ``sending`` (name: ms), against last backwards at
    the same micro-batch position with none inside, ``quiet``, whose spread (largest less smallest) is the bar: a
    backward beyond the quiet ones' median by more than that spread is said; one within it, or under, the run does
    not show a cost for. A list in ``quiet``: one stage's steps. ``where``: a lead-in ("On 1 Gbit/s"). One step each:
    words for what this run shows, not a cause."""
    each = [ms for v in quiet.values() for ms in (v if isinstance(v, list) else [v])]
    mid, bar = statistics.median(each), max(each) - min(each)
    said = (
        f"{where + ', l' if where else 'L'}ast backward less the check and any wait in it, "
        "with messages inside it: "
        + listed([f"{s} {ms:.0f}" for s, ms in sending.items()])
        + " ms; with none: "
        + listed(
            [
                f"{s}'s steps {listed([f'{ms:.0f}' for ms in v])}" if isinstance(v, list) else f"{s} {v:.0f}"
                for s, v in quiet.items()
            ]
        )
        + f", median {mid:.0f}, spread {bar:.0f}"
    )
    over = [s for s, ms in sending.items() if round(ms - mid) > round(bar)]
    within = [s for s in sending if s not in over]
    if over:
        said += (
            ": "
            + listed([f"{s}'s {sending[s] - mid:.0f} ms" for s in over])
            + " over that median, more than the spread: in this run a backward that sent ran longer, time neither "
            "exposed nor waited"
            " counts"
        )
    if within:
        said += f"{'; ' if over else ': '}{listed(within)} not over the median by more than the spread: this run does "
        said += "not show a cost of sending from inside the backward"
    return said + " (one step each)."


def say_exposed_parts(looks: dict, stage: str, before: str) -> None:
    """``stage`` against ``before`` (both waiting for each message inside the backward): link time and exposed, in
    whole ms as :func:`lesson.say_look` prints (one step each: no ranking on them), the link time before each wait
    began (exposed is link time less that), and where ``stage`` waited less, how the drop splits into exposed and the
    waiting after the link had delivered (time the link does not model), and which part is most of it; where both wait
    inside the backward (hook, bucket), their last backwards less the check less those waits, beside single's."""
    (link, exposed), (link0, exposed0) = (lesson.link_parts(looks[s]) for s in (stage, before))
    n, n0 = looks[stage]["calls"], looks[before]["calls"]
    said = f"{stage} against {before}: link time {link} against {link0} ms, exposed {exposed} against {exposed0}"
    if all(lesson.waits_each(looks[s]) for s in (stage, before)):
        said += (
            f", link time before each wait began {link - exposed} against {link0 - exposed0} ({n} waits against "
            f"{n0}; exposed is link time less it)"
        )
    waited, waited0 = (round(looks[s]["waited_ms"]) for s in (stage, before))
    if waited < waited0:
        drop = lesson.after_delivery_ms(looks[before]) - lesson.after_delivery_ms(looks[stage])
        rose = exposed - exposed0
        said += (
            f". It waited {waited0 - waited} ms less, {waited} against {waited0}: {abs(drop)} ms "
            f"{'less' if drop >= 0 else 'more'} after the link had delivered, {abs(rose)} ms "
            f"{'more' if rose >= 0 else 'less'} exposed"
        )
        if abs(drop) > abs(rose):  # the waits after delivery: each wait's, times the waits
            each, each0 = (lesson.after_delivery_ms(looks[s]) / looks[s]["waits"] for s in (stage, before))
            said += (
                f"; most of the drop is waiting after the link had delivered, {each:.2f} against {each0:.2f} ms a "
                f"wait, over {looks[stage]['waits']} waits against {looks[before]['waits']}"
            )
        else:
            said += "; most of the drop is exposed time"
    else:
        said += f". It waited {waited} ms against {waited0}"
    if all(looks[s]["waits_in_backward"] == looks[s]["waits"] for s in (stage, before)):  # hook, bucket: always
        b, b0 = (round(backward_less_check(looks[s]) - looks[s]["waited_ms"]) for s in (stage, before))
        d = b0 - b
        said += (
            f". Less their waits (all inside it), their last backwards less the check took {b} against {b0} ms, "
            f"single's {round(backward_less_check(looks['single']))}: time neither exposed nor waited, "
            + (f"{abs(d)} ms {'less' if d > 0 else 'more'} for {stage}" if d else "the same whole ms for both")
        )
    say(said + ".")


def end_parts(row: dict) -> tuple[int, float, float, float]:
    """A step's *link after backward* in parts that add up: ``(k, at, after, span)``: the message whose hand-over set
    the link's end (:func:`~minddp.costmodel.buckets.queue_end`, 0: the first), its hand-over into the last backward,
    the transfers from it on, back to back, and the backward, ms; link after backward = ``at + after - span``. ``at``
    and ``span`` leave out the check (``row["checks"]``, rank 0's spans) inside the last backward: it comes before
    the backward's first send, so no message leaves during it."""
    from minddp.costmodel.buckets import queue_end

    b0, b1 = row["backward"][-1]
    held = sum(max(0.0, min(e, b1) - max(s, b0)) for s, e in row.get("checks", []))  # as backward_less_check
    sent = sorted(row["sent"])
    took = [e - s for s, e in sorted(row["messages"])]
    _, k = queue_end(sent, took)
    return k, sent[k] - b0 - held, sum(took[k:]), b1 - b0 - held


def said_end(stage: str, row: dict, check: bool = True) -> str:
    """How a step's *link after backward* came about, in numbers that add up (:func:`end_parts`, less the check),
    then which of the bucket lesson's costs that is: the late start (the first message set it), the last transfer
    (the last), or a message handed over late, the link idle before it."""
    k, at, after, span = end_parts(row)
    n = len(row["sent"])
    less = " less the check" if check else ""  # ddp has no check: its backward is the whole backward
    if at + after <= span:
        return (
            f"{stage}'s link was done {span - at - after:.1f} ms before its last backward ended: no link after backward"
        )
    who = "its first message" if k == 0 else f"message {k + 1} of {n}"
    why = (
        "the link ran back to back from the first message on, so the late start and the link time set it"
        if k == 0
        else "the last transfer set it: the last message, handed over late"
        if k == n - 1
        else "a message handed over late set it, the link idle before it"
    )
    return (
        f"{stage}'s link after backward, {at + after - span:.1f} ms: {who}, handed over {at:.1f} ms into its last "
        f"backward{less}, + {after:.1f} ms of transfers from it on, − that backward's {span:.1f}; {why}"
    )


def floor_said(v: dict, stage: str) -> str:
    """Link time against a stage's last backward less the check: messages leave only after the check, so any excess
    is the least its link after backward can be."""
    from minddp.costmodel.buckets import on_the_link

    back = backward_less_check(v)
    link = on_the_link(v["row"])["link_ms"]
    said = f"{stage}'s link time, {link:.1f} ms, "
    if link > back:
        return said + (
            f"exceeds its last backward less the check, {back:.1f}: messages leave only after the check, so at least "
            f"{link - back:.1f} ms must be left after the backward, whatever the hand-overs"
        )
    return (
        said + f"fits in its last backward less the check, {back:.1f}: on that backward nothing need be left after it"
    )


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
        "Late start, on the bare network: the first gradient is ready after "
        f"{100 * 1e3 * min(bare.ready) / backward:.1f} % of the backward; bucket-async's first message, its "
        + "earliest full bucket, "
        + ("the plan's first" if first == 0 else f"bucket {first + 1} of the plan's {len(plan)}")
        + f" ({len(plan[first])} gradients), after {100 * 1e3 * filled[first] / backward:.0f} %."
    )
    b = "bucket-async"  # with the least its link after backward can be
    say(f"{said_end(b, looks[b]['row'])}. {floor_said(looks[b], b)}.")
    say(f"{said_end('hook-async', looks['hook-async']['row'])}.")
    say(
        f"{said_end('ddp', looks['ddp']['row'], check=False)}."
    )  # torch's buckets rebuilt: what set ddp's, the same terms
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
    """The cap sweep in words: the sweep's median backward, ``this_run_s``, which the model replays; then how far the
    steps' link after backward lay under and over the model's (``model``: the grid's
    :func:`~minddp.costmodel.buckets.plan_costs`, ``default``: None's), each step on its own backward; then the
    model's costs at its least, the smallest cap, the workload's and None, and of the steps with no warm-up (every cap
    but the workload's) the one least on last backward less the check + waited, the warm workload's step apart."""
    from minddp.costmodel.buckets import on_the_link

    said = f"The model replays the sweep's median backward, {1e3 * this_run_s:.0f} ms."
    modeled = {c.cap_mb: 1e3 * c.after_backward for c in [*model, default]}
    off = {c: on_the_link(v["row"])["end_ms"] - modeled[c] for c, v in swept.items() if c in modeled}
    lo, hi = min(off, key=off.__getitem__), max(off, key=off.__getitem__)
    own = {c: backward_less_check(v) for c, v in swept.items()}  # each step's own backward, which its link met
    if round(off[hi]) <= 0:
        said += f" Every step's link after backward was at or under the model's, by up to {-off[lo]:.0f} ms"
        said += f" ({cap_name(lo)}, on a backward of {own[lo]:.0f})"
    elif round(off[lo]) >= 0:
        said += f" Every step's link after backward was at or over the model's, by up to {off[hi]:.0f} ms"
        said += f" ({cap_name(hi)}, on a backward of {own[hi]:.0f})"
    else:
        said += (
            f" The steps' link after backward lay from {-off[lo]:.0f} ms under the model's ({cap_name(lo)}, on a "
            f"backward of {own[lo]:.0f}) to {off[hi]:.0f} ms over it ({cap_name(hi)}, {own[hi]:.0f})"
        )
    say(said + ".")
    best = min(model, key=lambda c: c.after_backward)  # the model's least link after backward over the grid
    ties = [c for c in model if f"{1e3 * c.after_backward:.1f}" == f"{1e3 * best.after_backward:.1f}"]
    at = {c.cap_mb: c for c in model}
    here = next(iter(swept))  # the workload's cap: the sweep's first step is the bucket-async step above

    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:.1f}"

    said = (
        f"By the model, link after backward is least at {listed([cap_name(c.cap_mb) for c in ties])}, "
        f"{ms(best.after_backward)} ms, "
        + (f"at {cap_name(best.cap_mb)} " if len(ties) > 1 else "")
        + f"its first message ready {ms(best.first_at)} ms in"
    )
    small = model[0]
    if small not in ties:
        said += (
            f"; at {cap_name(small.cap_mb)} {ms(small.after_backward)}, its fixed costs {ms(small.fixed)} ms against "
            f"{ms(best.fixed)}"
        )
    for c in (here, None):
        p = at.get(c, default)
        if p not in ties:
            said += (
                f"; at {cap_name(c)}{' (the workload)' if c == here else ''} {ms(p.after_backward)}, its first message "
                f"ready {ms(p.first_at)} ms in and last message's transfer {ms(p.tail)}"
            )
    # the steps on their parts: last backward less the check + waited; the workload's step had a warm-up, the rest not
    spent = {c: round(own[c] + v["waited_ms"]) for c, v in swept.items()}
    cold = [c for c in swept if c != here]
    low = min(cold, key=spent.__getitem__)
    said += (
        f". On last backward less the check + waited, the steps with no warm-up spent least at {cap_name(low)}, "
        f"{spent[low]} ms; the warm workload's step {spent[here]}, not comparable (one step each)."
    )
    say(said)


def sweep_figure(swept: dict, model: list, default, link_name: str, world: int, here):
    """The cap sweep's figure: the model's *link after backward* against the cap, beside each measured step's own
    link after backward (the same measure), and the three costs of each plan below. torch's default (None) has no
    cap on this axis: its measured and modeled points are drawn right of the grid, apart, each at a tick named None."""
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
            f"one step: cap None, link after backward {measured[None]:.0f} ms",
        ),
        (
            64,
            1e3 * default.after_backward,
            f"step-time model: cap None, link after backward {1e3 * default.after_backward:.0f} ms",
        ),
    ]
    fig = bucket_sweep(
        {"step-time model: link after backward": model},
        measured=points,
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
    # first message ready: the earliest full bucket's (for None not the plan's first bucket), as the figure's panel
    table = table.rename(
        columns={
            "link, ms": "link time, ms",
            "first message ready, ms into the model's backward": "earliest full bucket, ms into the model's backward",
        }
    )  # the vocabulary's name, as every other table
    table = table.infer_objects().round(1).astype({"buckets": int})
    whole = ["exposed, ms (one step)", "waited, ms (one step)"]  # whole ms, as every other table and line prints them
    table[whole] = table[whole].astype("Int64")
    return table.astype(object).where(table.notna(), "–")  # "–": a cap not run


def backwards_s(stage: str, model: str, steps: int = 3) -> list[float]:
    """``steps`` profiled steps' last backwards of ``stage`` (one micro-batch, each step after a warm-up step of its
    own), seconds, this rank's."""
    return [lesson.Trainee(stage, model=model, grad_accum=1).look()["last_backward_ms"] / 1e3 for _ in range(steps)]


def rank0s(value: float) -> float:
    """Rank 0's ``value`` on every rank (a broadcast): a timing every rank must build the same link from."""
    from minddp.runtime.device import message_device

    rank0 = torch.tensor([value], dtype=torch.float64, device=message_device())
    dist.broadcast(rank0, src=0)
    return rank0.item()


def say_sized(
    name: str,
    ranks: int,
    link_name: str,
    model_name: str,
    ratios: tuple,
    n_tensors: int,
    blog,
    sync_bytes: int,
    backward_s: float,
    how: str,
    cap: float,
) -> None:
    """One sized link, in a sentence: the setting's ratios, the network, the backward it was sized from, the cap
    with the two byte counts it is scaled by (``blog``: SmolLM2's profile, its gradients in the blog's dtype), in
    MiB to two decimals so the cap can be recomputed from the printed numbers."""
    from minddp.costmodel.project import BLOG

    bytes_ratio, message_ratio = ratios
    say(
        f"{name}: on {link_name} with {ranks} ranks one sync's bytes take {bytes_ratio:.2f} "
        f"of the sizing backward, one message's fixed cost {message_ratio:.1e}. Here {model_name}: {n_tensors} "
        f"gradient tensors, {sync_bytes / 2**20:.2f} MiB (SmolLM2-360M: {len(blog.nbytes)}, "
        f"{blog.total_bytes / 2**20:.2f} MiB of {BLOG['dtype_bytes']}-byte gradients), a sizing backward of "
        f"{1e3 * backward_s:.0f} ms ({how}); a cap of {cap:.2f} MiB."
    )


def sent_inside(runs: dict) -> dict[str, float]:
    """The stages in ``runs`` that send from inside the backward (hook on), each one's last backward less the check
    less the waits inside it: all of a stage's waits (hook, bucket) or none (hook-async, bucket-async); a stage with
    some of its waits inside is left out. ``runs``: name to a dict with backward_ms, waited_ms, waits and
    waits_in_backward."""
    out = {}
    for s in ("hook", "hook-async", "bucket", "bucket-async"):
        r = runs.get(s)
        if r is None or 0 < r["waits_in_backward"] < r["waits"]:
            continue
        out[s] = r["backward_ms"] - (r["waited_ms"] if r["waits_in_backward"] else 0.0)
    return out


def say_sized_measures(t4: dict, far: dict, single_far: list[float]) -> None:
    """Each sized link's rungs (2 ranks): link time, exposed, waited and the step's own last backward less the check,
    then in words which rungs exposed none of their link time (whole ms), which over half of it and which the rest, and
    the last backwards of those that send inside them, less their waits there (:func:`sent_inside`), against those
    with no message inside them (:func:`against_quiet`;
    4 × T4: simple's and ga's; 1024 ranks: single's steps, ``single_far``, seconds); a whole-ms match of
    bucket-async's backward on the two links is said to be chance (two networks, two steps)."""
    for name, runs in (("4 × T4", t4), ("1024 ranks", far)):
        what = "link time, exposed, waited and last backward less the check, ms" if runs is t4 else "those four"
        hid = [s for s, r in runs.items() if round(r["exposed_ms"]) == 0]
        most = [s for s, r in runs.items() if r["exposed_ms"] > r["link_ms"] / 2]
        some = [s for s in runs if s not in hid + most]
        said = []
        said += [f"{listed(hid)} exposed none"] if hid else []
        said += [f"{listed(most)} exposed over half of {'their' if len(most) > 1 else 'its'} link time"] if most else []
        said += [f"{listed(some)} exposed some, at most half"] if some else []
        say(
            f"Sized for {name}; {what}: "
            + "; ".join(
                f"{s} {r['link_ms']:.0f}, {r['exposed_ms']:.0f}, {r['waited_ms']:.0f}, {r['backward_ms']:.0f}"
                for s, r in runs.items()
            )
            + f". {'; '.join(said)}."
        )
        quiet = (
            {s: t4[s]["backward_ms"] for s in ("simple", "ga")}
            if runs is t4
            else {"single": [1e3 * b for b in single_far]}
        )
        say(against_quiet(sent_inside(runs), quiet))
    if round(t4["bucket-async"]["backward_ms"]) == round(far["bucket-async"]["backward_ms"]):
        say(
            f"bucket-async's backward, {t4['bucket-async']['backward_ms']:.0f} ms on both links, is the same whole ms "
            "by chance: two networks, two steps."
        )


def say_takeaway(looks: dict, t4: dict, far: dict) -> None:
    """The takeaway in words, per setting (this notebook's link: ``looks``; the sized links' runs): hook-async
    against bucket-async on exposed and on the step's parts from its last backward's start to its sync's end, last
    backward less the check + waited (both stages wait only in finish, after the backward), whole ms, worded by which
    is less; and the link time bucketing saved (fewer messages' fixed costs: the same bytes), as a share of
    hook-async's. Then in which settings bucketing's step spent less on those parts. No cause: the parts only."""
    from minddp.costmodel.buckets import on_the_link

    here = {
        s: on_the_link(looks[s]["row"]) | {"backward_ms": backward_less_check(looks[s])}
        for s in ("hook-async", "bucket-async")
    }
    side = {"less": [], "more": [], "as much": []}
    for name, runs in zip(SETTING_NAMES, (here, t4, far)):
        h, b = runs["hook-async"], runs["bucket-async"]
        x, y = round(h["exposed_ms"]), round(b["exposed_ms"])
        p, q = (round(r["backward_ms"] + r["waited_ms"]) for r in (h, b))
        spent = "as much" if p == q else "less" if q < p else "more"
        side[spent].append(name[0].lower() + name[1:])
        exposed = "as much" if x == y else "less" if y < x else "more"
        saved = h["link_ms"] - b["link_ms"]  # the same bytes: the fixed costs of the messages bucketing saved
        say(
            f"{name}: {'hook-async against bucket-async, ' if runs is here else ''}exposed {x} against {y} ms, "
            "last backward less the check + "
            f"waited {p} against {q}; bucketing's step spent "
            + (f"{abs(p - q)} ms {spent}" if p != q else "as much")
            + f" there and exposed {exposed}; fewer messages cut the link time by {saved:.1f} ms, "
            f"{100 * saved / h['link_ms']:.0f} % of hook-async's."
        )
    say(
        "On those two parts, bucketing's step spent "
        + "; ".join(f"{k} {listed(v)}" for k, v in side.items() if v)
        + " (one step each)."
    )
