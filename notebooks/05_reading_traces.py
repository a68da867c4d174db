# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Reading traces: where does the time go?
#
# Each rank can record a profiler trace of its steps (open one in https://ui.perfetto.dev, or
# `chrome://tracing`). This notebook profiles one step of each stage of the DDP ladder that keeps a
# whole replica on every rank (`03_build_up`: `simple` to `bucket-async`, and `ddp`; the sharded rungs
# are read in `06_sharding`), torch's DDP and `single` (one rank's work, no communication), on the
# workload every notebook shares, then reads the traces with `minddp.analysis` the way the blog this
# course follows reads its GPU traces with HolisticTraceAnalysis (HTA). It reads two of HTA's numbers,
# under HTA's names (`docs/analysis.md` defines every measure named here, each computed by its one
# function in `minddp.analysis.metrics`):
#
# * **non-compute** (HTA's temporal breakdown, `non_compute_pctg`): the share of the profiled step
#   when a communication range was open *and the training thread ran no `aten::` operator*;
# * **overlap** (HTA's `comm_comp_overlap_pctg`): the share of the time in flight during which compute
#   ran too (*in flight*: the time a communication range was open).
#
# The two divide different totals and are tied by the time in flight: non-compute time = (100 % −
# overlap) × time in flight (a claim below checks it for every stage and rank of the loopback run). Neither is
# the time the step lost to communication: non-compute also counts the training thread's own Python (its
# hooks, the time between autograd nodes) while a range is open, and a range held open while gloo waits for
# the other rank (below). Then **one step of each stage on one time axis**, and at the end, over an emulated
# link, two measures of the time the thread stood still (*waited* and *exposed*) and **what each idea
# bought**, here and on the blog's GPUs.
#
# The letters are `01_collectives`' notation: n ranks, α the fixed cost of one hop of the ring, k the
# micro-batches of a step. A *message* here is one whole all_reduce call (a bucket's or a parameter's;
# the tables' *all_reduce calls* and *messages sent* and the timeline's row labels count them), which on a ring
# makes 2(n−1) hops from each rank, so its fixed cost is 2(n−1)·α.
#
# HTA reads GPU traces only; on these CPU traces `minddp.analysis` computes the same metrics from
# the CPU events (definitions in `docs/analysis.md`).

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import os
import shutil
from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER, STAGES
from minddp.notebook import lesson

RUN = lesson.trace_dir("05_reading_traces")
if rank == 0:
    shutil.rmtree(RUN, ignore_errors=True)  # a fresh run folder: the analysis refuses mixed runs
dist.barrier()
ddp_ladder = [s for s in STAGES if s not in SHARDED_OPTIMIZER + SHARDED_GRADIENTS]  # the sharded rungs: 06
profiled = ["single", *ddp_ladder, "torch"]
for stage in profiled:
    # warmup=0: no step before profile(); profile() itself takes one step that the profiler discards
    # (the first step's one-off costs stay out), then the one step it records
    lesson.Trainee(stage, warmup=0).profile(RUN, steps=1)
lesson.say(lesson.describe())
lesson.say(f"Profiled one step of each of: {', '.join(profiled)}, into {RUN.relative_to(lesson.ROOT)}.")
# the blog's six stages again, their gradients' all_reduces over an emulated 1 Gbit/s network (the last section)
LINKED = lesson.trace_dir("05_reading_traces_1gbit")
if rank == 0:
    shutil.rmtree(LINKED, ignore_errors=True)
dist.barrier()
blog = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
for stage in blog:
    lesson.Trainee(stage, warmup=0, link="1gbit").profile(LINKED, steps=1)
load, cores = os.getloadavg(), os.cpu_count()
lesson.say(
    f"Profiled one step of each of: {', '.join(blog)} over an emulated 1gbit link, into "
    f"{LINKED.relative_to(lesson.ROOT)}.",
    f"This machine has {cores} CPU cores; its load average (processes running or ready to run, "
    f"over the last 1, 5 and 15 min) was {', '.join(f'{x:.1f}' for x in load)} when the profiling ended.",
)

# %%
# %dist_shutdown

# %% [markdown]
# The ranks are done; the analysis runs here, in the notebook's own process. One row per (stage,
# rank) first, with the step and the time backward ran, every micro-batch's. *Backward* here and in
# every table below is the span from the first to the last autograd node of a micro-batch: the
# gradients' computation, and for `hook` and `bucket` also their waits for each message, which their
# hooks make inside those nodes (`docs/analysis.md`: a hook that blocks makes the backward longer).
#
# The two ranks of a stage do the same work, yet their shares need not agree; the cell below says where
# their non-compute differed most.

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, display
from minddp.analysis import analyze_run, metrics
from minddp.analysis.names import HEADERS
from minddp.analysis.report import plot_timeline
from minddp.notebook import lesson

RUN = lesson.trace_dir("05_reading_traces")
result = analyze_run(RUN)


def backward_ms(run) -> pd.Series:
    """The time backward ran in the profiled step, every micro-batch's, per (stage, rank), in ms."""
    b = run.phases[run.phases["phase"] == "backward"]
    return (b["end_us"] - b["start_us"]).groupby([b["stage"], b["rank"]]).sum() / 1e3


per_rank = result.summary.assign(
    step_ms=result.summary["step_time_us"] / 1e3,
    backward_ms=[
        backward_ms(result).get((st, r), 0.0) for st, r in zip(result.summary["stage"], result.summary["rank"])
    ],
    allreduce_MiB_per_step=result.summary["allreduce_bytes_per_step"] / 2**20,
)
columns = ["stage", "rank", "step_ms", "backward_ms", "compute_pctg", "non_compute_pctg", "idle_pctg"]
shown = columns + ["comm_comp_overlap_pctg", "allreduce_calls_per_step", "allreduce_MiB_per_step"]
shown += ["allgather_calls_per_step"]  # the parameter check's all_gathers (the next section)
NAMES = {**HEADERS, "step_ms": "step (ms)", "backward_ms": "backward (ms)", "compute_pctg": "compute (%)"}
NAMES |= {"idle_pctg": "idle (%)", "allreduce_calls_per_step": "all_reduce calls"}
NAMES |= {"allreduce_MiB_per_step": "all_reduce bytes (MiB)", "allgather_calls_per_step": "all_gather calls"}
display(per_rank[shown].rename(columns=NAMES).round(1))  # each column under its measure's name
nc = per_rank.pivot(index="stage", columns="rank", values="non_compute_pctg").drop(index="single")
widest = (nc[0] - nc[1]).abs().idxmax()
lesson.say(
    "all_reduce bytes: the bytes the step's all_reduce calls reduce on one rank, summed over the calls.",
    f"The ranks disagree most for {widest}: non-compute {nc.loc[widest, 0]:.1f} % of the step on rank 0, "
    f"{nc.loc[widest, 1]:.1f} % on rank 1. The mean of the two ({nc.loc[widest].mean():.1f} %) describes neither "
    "rank; the tables and charts below say whose numbers they show.",
)

# %% [markdown]
# ## Temporal breakdown and overlap
#
# What the columns mean on this machine (CPU, gloo):
#
# * **compute** is time when the training thread ran an `aten::` operator (forward, backward, the
#   optimizer, the stages' copies into and out of buckets);
# * **non-compute** is time when one of gloo's threads was inside a `gloo:*` range while the training
#   thread ran no `aten::` op: it was waiting, running its own Python (hooks, the time between autograd
#   nodes) or had no core;
# * **idle** is the rest, when the training thread ran no `aten::` op and no gloo range was open: its
#   Python between `aten::` ops, its
#   waits with no collective in flight, and any time it was ready to run but had no core (no output
#   here splits idle time into these); `single`, which never communicates, has idle time too;
# * **overlap** is the share of the time in flight during which compute ran too. `single` has no time
#   in flight to divide by: its 0 is the definition's convention, not a measured 0.
#
# Communication here is every gloo range, not only the gradients': minddp's stages `simple` to
# `bucket-async` also check, at every sync, that both ranks' forwards used the same parameters
# (`minddp.stages.checks`: one all_gather, the table's *all_gather calls*; `simple` syncs after every
# micro-batch, the others once a step; `ddp` and torch's DDP run no such check).
#
# The caveat that decides how to read the communication numbers: a gloo range lasts from the moment
# gloo's thread picks the collective up until it is done, so it is also *held open* until the other
# rank arrives at the same collective, and while gloo's thread waits for a core. All of it counts as in
# flight (and as non-compute while the training thread computes nothing). On GPUs the same metrics read
# NCCL kernels against compute kernels, which run side by side.
#
# The chart below draws each rank's non-compute and overlap, stage by stage, side by side.

# %%
stages = list(result.stages.index)
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharex=True)
colors = {0: "#937860", 1: "#da8bc3"}  # the ranks: not orange, which is communication in every chart
for ax, column, label in (
    (axes[0], "non_compute_pctg", "non-compute, % of the step"),
    (axes[1], "comm_comp_overlap_pctg", "overlap, % of the time in flight"),
):
    table = per_rank.pivot(index="stage", columns="rank", values=column).loc[stages]
    for r in table.columns:
        ax.bar(
            [i + 0.4 * (r - 0.5) for i in range(len(stages))], table[r], width=0.4, label=f"rank {r}", color=colors[r]
        )
    ax.set(xlabel="stage", ylabel=label)
    ax.set_xticks(range(len(stages)), stages, rotation=35, ha="right")
axes[0].set_ylim(0, 1.25 * per_rank["non_compute_pctg"].max())  # its own scale: the ranks' differences show
axes[1].set_ylim(0, 100)
axes[0].legend()
for ax, y in ((axes[0], 0.04 * axes[0].get_ylim()[1]), (axes[1], 3)):  # single's 0s: nothing in flight to measure
    ax.text(stages.index("single"), y, "none in\nflight", ha="center", fontsize=8)
for ax, column in ((axes[0], "non_compute_pctg"), (axes[1], "comm_comp_overlap_pctg")):
    for (st, r), value in per_rank.set_index(["stage", "rank"])[column].items():  # measured, but a bar too low to see
        if st != "single" and value < 1:
            y = 0.02 * ax.get_ylim()[1]
            ax.text(stages.index(st) + 0.4 * (r - 0.5), y, f"{value:.1f}", ha="center", va="bottom", fontsize=7)
fig.suptitle("Each rank's own numbers, one profiled step per stage (loopback)")
fig.savefig(RUN / "per_rank.png", bbox_inches="tight")
plt.close(fig)
display(Image(filename=RUN / "per_rank.png"))

# %%
own = per_rank[per_rank["stage"] != "single"].set_index(["stage", "rank"])  # each rank's own numbers
alone = per_rank[per_rank["stage"] == "single"]


def at(column, pick):
    """The least (pick=min) or most value of `column`, as printed, and every (stage, rank) that has it."""
    shown = own[column].round(1)
    where = shown[shown == pick(shown)].index
    named = "; ".join(f"{st}, rank {rk}" for st, rk in where) if len(where) <= 3 else f"{len(where)} stage-ranks"
    return f"{pick(shown):.1f} % ({named})"


def span(values):
    """ "a–b %" to one decimal, as the table prints them."""
    return f"{min(values):.1f}–{max(values):.1f} %"


lesson.say(
    f"Rank by rank, computation was {span(own['compute_pctg'].round(1))} of the profiled step in the stages that "
    "communicate, "
    f"{span(alone['compute_pctg'].round(1))} in single, which sends nothing. Non-compute ranges from "
    f"{at('non_compute_pctg', min)} to {at('non_compute_pctg', max)}, overlap from "
    f"{at('comm_comp_overlap_pctg', min)} to {at('comm_comp_overlap_pctg', max)}.",
)
waiting = [st for st in ("simple", "ga", "hook", "bucket") if st in own.index]
asynchronous = [st for st in ("hook-async", "bucket-async", "ddp", "torch") if st in own.index]
ov = own["comm_comp_overlap_pctg"]
split = ov[waiting].max() < ov[asynchronous].min()
lesson.say(
    ("What holds on both ranks is the coarse split" if split else "Not even the coarse split holds on both ranks")
    + f": the stages that wait for each message as it is sent ({', '.join(waiting)}) overlapped at most "
    f"{ov[waiting].max():.1f} %, the asynchronous ones ({', '.join(asynchronous)}) at least "
    f"{ov[asynchronous].min():.1f} %.",
)
in_flight = own["comm_time_per_step_us"]  # one profiled step: the step's time in flight
# exact by the definitions (non-compute = in flight − in flight under compute); the margin is float rounding only
tied = ((own["non_compute_time_us"] - (1 - ov / 100) * in_flight).abs() <= 1e-9 * in_flight + 1e-3).all()
lesson.claim(tied, "For every stage and rank, non-compute time = (100 % − overlap) × time in flight.")

# %% [markdown]
# The two ranks' percentages need not agree (the chart): one profiled step is one sample, so read no finer
# order into them than both ranks show, and look at the timeline below.

# %% [markdown]
# ## One step of each stage, on one time axis
#
# One row per profiled stage, one shared axis in milliseconds from the start of the profiled step (rank 0).
# In each row: the forward (pale) and backward (darker: the span defined above) of each micro-batch,
# a tick when a message (a bucket's; a parameter's in the per-parameter stages) was *handed to the wire*
# (its gradients all there: for minddp's stages its hook called, for torch's DDP, which has no hook range,
# the reducer's `c10d::allreduce_` call; `ready_us` in the tables below), an orange bar while its gloo
# all_reduce range was open (the legend's "collective in flight (held open included)"; where dozens of
# narrow bars crowd, they merge into dark blocks; the parameter check's all_gather is not drawn), the *finish*
# (purple, a span from its start to its end, the legend's "finish (sync ends)": `finish_gradient_synchronization()`, which the training loop calls after every backward; a
# short one is too thin to see), the optimizer (green) and the end of the step.
#
# Three shapes to tell apart:
#
# * **waiting after backward** (`simple` after every micro-batch, `ga` after the last): the ticks
#   and bars come after a backward band, and the step ends only when they are done;
# * **waiting inside backward** (`hook`, `bucket`): ticks and bars inside the last backward band: each
#   hook waits for its message before backward goes on;
# * **asynchronous** (`hook-async`, `bucket-async`, `ddp`, `torch`): ticks inside the band, bars
#   running on while backward goes on; what is still running when the band ends is waited for before
#   the optimizer step: in the finish (purple) for `hook-async` and `bucket-async`; for `ddp` and torch's
#   DDP at the end of the `loss.backward()` call, after the band's last autograd node.
#
# The profiler numbers steps from 0: step 0 is the step `profile()` discards, so the title's and the
# tables' step 1 is the one recorded.

# %%
fig = plot_timeline(result, RUN / "bucket_timeline.png")
display(Image(filename=RUN / "bucket_timeline.png"))

# %% [markdown]
# The numbers behind the plot, stage by stage (rank 0): how many messages each sent in this step, how
# many were handed to the wire (`ready_us`) while a backward was still running, how long the last
# backward ran (the span defined above), the *tail* (how long after the last backward's end the last
# all_reduce before the optimizer ended: the column `tail_us` of `RunAnalysis.per_step`; for `simple`
# the last sync's only), and the step.

# %%
phases, buckets = result.phases[result.phases["rank"] == 0], result.buckets[result.buckets["rank"] == 0]
tails = result.per_step[result.per_step["rank"] == 0].groupby("stage")["tail_us"].last() / 1e3
rows = {}
for stage in [st for st in result.stages.index if st != "single"]:
    p, b = phases[phases["stage"] == stage], buckets[buckets["stage"] == stage]
    backward = p[p["phase"] == "backward"]
    during = sum(((backward["start_us"] <= t) & (t <= backward["end_us"])).any() for t in b["ready_us"])
    rows[stage] = {
        "messages sent": len(b),
        "sent during a backward": during,
        "last backward, ms": (backward["end_us"].iloc[-1] - backward["start_us"].iloc[-1]) / 1e3,
        "tail, ms": tails[stage],
        "step, ms": p.loc[p["phase"] == "step", "end_us"].max() / 1e3,
    }
anatomy = pd.DataFrame(rows).T
anatomy.round(1)

# %%
forward = phases[phases["phase"] == "forward"]
per_stage = forward.groupby("stage")["end_us"].sum() - forward.groupby("stage")["start_us"].sum()
last_bw, tail = anatomy["last backward, ms"], anatomy["tail, ms"]
quiet = [st for st in anatomy.index if anatomy.loc[st, "sent during a backward"] == 0]
busy = [st for st in anatomy.index if anatomy.loc[st, "sent during a backward"] > 0]
spread = per_stage.max() / per_stage.min()
over = int((last_bw[busy].round() > round(spread, 1) * last_bw[quiet].round().max()).sum())  # as printed
longer = over == len(busy)  # every sender's longer than the forward moved
lesson.say(
    f"The forward passes (rank 0), the same model and micro-batches in every stage, took {per_stage.min() / 1e3:.0f}–"
    f"{per_stage.max() / 1e3:.0f} ms per step across the stages ({per_stage.idxmin()}'s to {per_stage.idxmax()}'s, "
    f"{spread:.1f} ×), so a difference in step time here does not price a stage's communication.",
    f"The last backward computes the same gradients in every stage (its span also holds hook's and bucket's "
    f"waits for each message): it took {last_bw[quiet].min():.0f}–{last_bw[quiet].max():.0f} ms "
    f"in {' and '.join(quiet)}, which send nothing during it, and {last_bw[busy].min():.0f}–"
    f"{last_bw[busy].max():.0f} ms in the stages that send during it: "
    + (
        f"each of these more than {spread:.1f} × the longest of those, so in this run sending made backward longer."
        if longer
        else f"{over} of these {len(busy)} took more than {spread:.1f} × the longest of those (the forward's spread), so "
        "this run cannot tell what the sending cost."
    ),
)
ga_bw_end = phases[(phases["stage"] == "ga") & (phases["phase"] == "backward")]["end_us"].max()
ga_first = buckets.loc[buckets["stage"] == "ga", "comm_start_us"].min()
lesson.say(
    f"ga's tail ({tail['ga']:.0f} ms) runs from its last backward's end to its last all_reduce's end; its first "
    f"all_reduce started {(ga_first - ga_bw_end) / 1e3:.0f} ms after that backward's end (the parameter "
    "check's all_gather, not drawn, runs before the first send). In the stages that send during backward, "
    "the tail: " + "; ".join(f"{st} {tail[st]:.0f} ms" for st in busy) + "."
)
late = buckets[buckets["comm_end_us"] > buckets["step_end_us"]]
if len(late):
    lesson.say(
        f"{len(late)} all_reduce range(s) end after their step did (by up to "
        f"{(late['comm_end_us'] - late['step_end_us']).max() / 1e3:.2f} ms); the axis runs past them."
    )

# %% [markdown]
# The table of one stage's buckets (rank 0's), as `RunAnalysis.buckets` holds it: `step`, the profiled step it
# belongs to (1, numbered as above); `order`, its place in the step's sending order; `bucket`, its
# index; `numel` and `dtype`, what it carried; `hook`, the comm hook that sent it; `launch`, what
# launched it (`hook`, or for torch's DDP `reducer`, whose `hook` column also reads `reducer`); times in
# µs from the start of the step: `ready_us`, handed to the wire (the hook called), `launched_us`, the
# hook returned (for torch's DDP both are the reducer's `c10d::allreduce_` call), `comm_*`, gloo's
# all_reduce range was open, `step_end_us`, the step's end. The first cell's "buckets of 4 MiB" is the size at which a bucket closes: parameters join
# it until it holds 4 MiB or more (the one that crosses the line included), so a bucket can be a little
# over 4 MiB (`numel` × 4 bytes of float32), and the last holds what is left:

# %%
buckets[buckets["stage"] == "bucket-async"].drop(columns=["rank", "stage"]).round(0)

# %% [markdown]
# The same analysis from a shell, with an HTML report and these plots in the run folder:
# `python -m minddp.analyze traces/notebooks/05_reading_traces --report` (the folder holds your last
# run's traces). On GPU traces the breakdown and overlap come from HTA itself.

# %% [markdown]
# ## The ladder on a slower network
#
# The first cell also profiled the blog's six
# stages with their gradients' all_reduces over the **emulated 1 Gbit/s link** that `03_build_up` introduced
# (`minddp.comm.link`: the real all_reduce runs beside the modeled transfer, and the message is
# delivered when both are done; the parameter check's all_gather does not go through the link). The
# link's transfers are in the traces as `minddp.link:all_reduce` ranges on a thread of their own, and
# the analysis counts them as communication.
#
# The link's trace also records when the training thread stood still for a message, so two more
# measures appear (`docs/analysis.md`): **waited**, the time the training thread stood waiting for a
# message, whether for the link, the other rank or a core, and **exposed**, the part of that wait
# during which the link's modeled transfer was still running. The link carries one message at a time: a
# transfer starts when its rank hands the message over, or when the link is done with the one before; a wait
# starts when the training thread calls `wait()` on the message.

# %%
import torch
from minddp.comm.link import parse_link

LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked = analyze_run(LINKED)
link, world = parse_link("1gbit"), int(linked.summary["rank"].nunique())


def link_ms(stage, rk=0):
    """The stage's *link time* (metrics.link_time): each all_reduce of rank `rk`'s step modeled on the link, in ms."""
    sent = linked.buckets[(linked.buckets["rank"] == rk) & (linked.buckets["stage"] == stage)]
    size = {d: torch.empty(0, dtype=getattr(torch, d)).element_size() for d in sent["dtype"].unique()}
    return 1e3 * metrics.link_time(
        link, [("all_reduce", numel * size[d], world) for numel, d in zip(sent["numel"], sent["dtype"])]
    )


mine = linked.summary.set_index(["stage", "rank"])  # each rank's own numbers, one profiled step
waits = linked.per_step.groupby(["stage", "rank"])[["waited_us", "exposed_us"]].mean() / 1e3
on_link = pd.DataFrame(
    {
        "step (ms)": mine["step_time_us"] / 1e3,
        "backward (ms)": backward_ms(linked),
        "non-compute (%)": mine["non_compute_pctg"],
        "overlap (%)": mine["comm_comp_overlap_pctg"],
        "non-compute (ms)": mine["non_compute_time_us"] / 1e3,
        "waited (ms)": waits["waited_us"],
        "exposed (ms)": waits["exposed_us"],
        "link time (ms)": [link_ms(st, rk) for st, rk in mine.index],
    },
    index=mine.index,  # the stages in reading order
)
display(on_link.round(1))
blocking = ["simple", "ga", "hook", "bucket"]  # the stages that wait for every message, each as soon as it is sent
block = on_link.loc[blocking]
before = block["link time (ms)"] - block["exposed (ms)"]
after = block["waited (ms)"] - block["exposed (ms)"]
share = 100 * block["exposed (ms)"] / block["link time (ms)"]
rest = (on_link["non-compute (ms)"] - on_link["waited (ms)"]).round(1)  # as printed
lesson.say(
    "Every row is one rank's own numbers; the link time is what that rank's messages take on the modeled "
    "Gigabit Ethernet (`metrics.link_time`), from their sizes alone, the same on every run.",
    f"In the stages that wait for each message as it is sent ({', '.join(blocking)}) exposed was "
    f"{share.min():.0f}–{share.max():.0f} % of the link time: the rest of the link time "
    f"({before.min():.0f}–{before.max():.0f} ms) ran while the thread was not waiting. Their waited time is exposed plus {after.min():.0f}–{after.max():.0f} ms of waiting after the "
    "modeled transfer had ended, until the message was delivered (once gloo's real all_reduce was done too).",
    (
        f"In every row non-compute (ms) is at least waited; the rest ({rest.min():.1f}–{rest.max():.1f} ms) is "
        "non-compute time in which the link recorded no wait."
        if (rest >= 0).all()
        else f"Non-compute (ms) minus waited ranges from {rest.min():.1f} to {rest.max():.1f} ms across the rows."
    ),
)


# %% [markdown]
# ## What each idea bought, here and on the blog's GPUs
#
# The blog this course follows measured its ladder on four T4 GPUs (its run, not one of this
# notebook's; its figures as it states them): its first DDP spent ~15 % of the GPU time not
# computing, with 0 % overlap; gradient accumulation brought non-compute to ~5 %, still 0 % overlap;
# hooks that wait for each all_reduce, still 0 % overlap; async hooks brought non-compute to ~2 % with
# ~90 % overlap; buckets made no clear difference on top of that.
# Below, the same ideas on this machine, from the traces of this notebook, each idea as the step from
# one stage to the next, on the link: the calls (exact, the same on both ranks), where rank 0 sent its
# messages and their link time (exact: the modeled transfer of those calls and bytes), and the step,
# the backward, non-compute, overlap and exposed, each rank's own (rank 0 / rank 1, the table above's
# numbers), for one profiled step each. The blog compares async hooks with ga, not with hook, so the last
# column takes that step too. The stages ran one after the other, so their step and backward times carry
# the machine's speed of each moment: `docs/analysis.md` compares times only from steps taken in turns
# (`03_build_up` does); the cell after the table's says how far the speed moved during this run. Non-compute
# here holds the parameter check's all_gather ranges too (one at every sync: 3 a step in `simple`, 1 in the
# others, as the loopback table's all_gather calls show).

# %%
t = linked.stages  # its calls and bytes: the same on both ranks (the first claim below)


def sent_in_backward(run, stage):
    """How many of the stage's messages were handed over during a backward (rank 0's trace)."""
    p = run.phases[(run.phases["rank"] == 0) & (run.phases["stage"] == stage) & (run.phases["phase"] == "backward")]
    b = run.buckets[(run.buckets["rank"] == 0) & (run.buckets["stage"] == stage)]
    return int(sum(((p["start_us"] <= x) & (x <= p["end_us"])).any() for x in b["ready_us"]))


def arrow(values, fmt="{:.0f}"):
    return " → ".join(fmt.format(v) for v in values)


def by_rank(column, pair, fmt="{:.1f}"):
    """`column` of the link's table for each stage of `pair`, as "rank 0 / rank 1", before → after."""
    return arrow((" / ".join(fmt.format(on_link.loc[(st, rk), column]) for rk in range(world)) for st in pair), "{}")


ideas = [
    ("accumulate, sync once per step", ["simple", "ga"], "~15 % → ~5 %", "0 % → 0 %"),
    ("sync from hooks, during backward", ["ga", "hook"], "~5 % → not given", "0 % → 0 %"),
    ("do not wait inside backward", ["hook", "hook-async"], "not given (from ga: last column)", "0 % → ~90 %"),
    ("buckets", ["hook-async", "bucket-async"], "no clear difference", "no clear difference"),
]
# the blog gives async hooks' non-compute against ga, not against hook: the same comparison, from ga
as_blog = ("async hooks, from ga (the blog's comparison)", ["ga", "hook-async"], "~5 % → ~2 %", "0 % → ~90 %")
summary = pd.DataFrame(
    {
        idea: {
            "stages": arrow(pair, "{}"),
            "all_reduce calls/step (each rank)": arrow(t.loc[pair, "allreduce_calls_per_step"]),
            "sent during a backward (rank 0)": arrow(sent_in_backward(linked, s) for s in pair),
            "link time, ms (modeled, 1 Gbit/s, rank 0)": arrow(link_ms(s) for s in pair),
            "step, ms (1 Gbit/s), rank 0 / 1": by_rank("step (ms)", pair, "{:.0f}"),
            "backward, ms (1 Gbit/s), rank 0 / 1": by_rank("backward (ms)", pair, "{:.0f}"),
            "non-compute % (1 Gbit/s), rank 0 / 1": by_rank("non-compute (%)", pair),
            "overlap % (1 Gbit/s), rank 0 / 1": by_rank("overlap (%)", pair),
            "exposed, ms (1 Gbit/s), rank 0 / 1": by_rank("exposed (ms)", pair),
            "blog, 4 × T4: non-compute": blog_nc,
            "blog, 4 × T4: overlap": blog_ov,
        }
        for idea, pair, blog_nc, blog_ov in [*ideas, as_blog]
    }
)
display(summary)
nc = on_link["non-compute (%)"].round(1).unstack("rank")  # as printed
apart = (nc[0] - nc[1]).abs()  # how far the two ranks of one step disagree
changes = [abs(nc.loc[b, rk] - nc.loc[a, rk]) for _, (a, b), *_ in [*ideas, as_blog] for rk in range(world)]
lesson.say(
    f"On the link, the two ranks of one stage differed in non-compute by up to {apart.max():.1f} points of the "
    f"step ({apart.idxmax()}); {sum(c < apart.max() for c in changes)} of the {len(changes)} changes in the "
    "table's non-compute row (each rank's, from one stage to the next) are smaller than that"
    + (
        ": one profiled step each does not say whether non-compute fell with each idea as the blog's did."
        if any(c < apart.max() for c in changes)
        else "."
    )
)

# %%
calls = t["allreduce_calls_per_step"]
k = lesson.SETTINGS.grad_accum
lesson.claim(
    (linked.summary.groupby("stage")["allreduce_calls_per_step"].nunique() == 1).all(),
    "Both ranks made the same all_reduce calls in every stage on the link.",
)
lesson.claim(
    calls["simple"] == k * calls["ga"] and abs(link_ms("simple") - k * link_ms("ga")) < 1e-6 * link_ms("ga"),
    f"Accumulation divides the calls and the link time by k = {k}, the micro-batches of a step, exactly.",
)
lesson.claim(
    sent_in_backward(linked, "ga") == 0 and sent_in_backward(linked, "hook") == calls["hook"],
    "The hooks move every message from after the backward into it.",
)
sent = t["allreduce_bytes_per_step"]
fewer = calls["hook-async"] - calls["bucket-async"]
fixed = 2 * (world - 1) * link.latency * 1e3  # one message's fixed cost 2(n−1)·α, in ms
saved = link_ms("hook-async") - link_ms("bucket-async")
lesson.claim(
    fewer > 0 and sent["bucket-async"] == sent["hook-async"] and abs(saved - fewer * fixed) < 1e-9 * link_ms("ga"),
    f"Buckets cut the calls from {calls['hook-async']:.0f} to {calls['bucket-async']:.0f}, the bytes unchanged, "
    f"and so the link time from {link_ms('hook-async'):.1f} to {link_ms('bucket-async'):.1f} ms: {saved:.1f} ms, "
    f"the fixed cost of the {fewer:.0f} messages not sent, {fewer:.0f} × 2(n−1)·α = {fewer:.0f} × {2 * (world - 1)} × "
    f"{link.latency * 1e6:.0f} µs.",
)
ov, ex = on_link["overlap (%)"].round(1), on_link["exposed (ms)"].round(1)  # as printed


def both_ranks(column, a, b):
    """'rose' / 'fell' where `column` moved the same way on every rank from stage a to b, else None."""
    d = [column[(b, rk)] - column[(a, rk)] for rk in range(world)]
    return "rose" if all(x > 0 for x in d) else "fell" if all(x < 0 for x in d) else None


hidden = both_ranks(ex, "hook", "hook-async")
more = both_ranks(ov, "hook-async", "bucket-async"), both_ranks(ex, "hook-async", "bucket-async")
lesson.say(
    (
        f"Exposed, the time the thread stood waiting through the link's transfers, {hidden} on both ranks "
        f"from hook to hook-async ({by_rank('exposed (ms)', ['hook', 'hook-async'])} ms). "
        if hidden
        else ""
    )
    + (
        f"From hook-async to bucket-async overlap rose on both ranks "
        f"({by_rank('overlap (%)', ['hook-async', 'bucket-async'])} %) and so did exposed "
        f"({by_rank('exposed (ms)', ['hook-async', 'bucket-async'])} ms): overlap is not the time saved."
        if more == ("rose", "rose")
        else ""
    )
)
fw = linked.phases[(linked.phases["rank"] == 0) & (linked.phases["phase"] == "forward")]
fw_ms = (fw["end_us"] - fw["start_us"]).groupby(fw["stage"]).sum() / 1e3
lesson.say(
    f"On the link the forward passes, the same work in every stage, took {fw_ms.min():.0f}–{fw_ms.max():.0f} ms "
    f"per step (rank 0, {fw_ms.max() / fw_ms.min():.1f} ×): the machine's speed moved during this run, so the step "
    "and backward rows do not say what an idea saved (hook-async → bucket-async: step "
    f"{by_rank('step (ms)', ['hook-async', 'bucket-async'], '{:.0f}')} ms, against {saved:.1f} ms less link "
    "time); `03_build_up` times the stages in turns."
)


# %% [markdown]
# For what the same stages would do at other link speeds and at 8 to 1024 ranks, see
# `docs/scaling.md` (`python -m minddp.model project`).
