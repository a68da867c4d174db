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
# course follows reads its GPU traces with HolisticTraceAnalysis (HTA). It keeps two of HTA's numbers,
# under HTA's names, each with one meaning (`docs/analysis.md` defines every measure named here, each
# computed by its one function in `minddp.analysis.metrics`):
#
# * **non-compute** (HTA's temporal breakdown, `non_compute_pctg`): the share of the profiled step
#   when communication was in flight *and the training thread computed nothing*;
# * **overlap** (HTA's `comm_comp_overlap_pctg`): the share of the time in flight during which compute
#   ran too (*in flight*: the time communication was under way).
#
# They divide by different totals: a stage can overlap 90 % of its communication and still spend 10 %
# of its step in non-compute time. Neither is the time the step lost to communication: on these CPU
# traces a message is "in flight" also while gloo's range is held open (below). Then **one step of each
# stage on one time axis**, and at the end **what each idea bought**, here and on the blog's GPUs.
#
# The letters are `01_collectives`' notation: n ranks, α the fixed cost of one hop of the ring, k the
# micro-batches of a step. A *message* here is one whole all_reduce call (a bucket's or a parameter's;
# the timeline's row labels count them), which on a ring makes 2(n−1) hops from each rank, so its fixed
# cost is 2(n−1)·α.
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
    f"over the last 1, 5 and 15 min) was {', '.join(f'{x:.1f}' for x in load)} when the profiling ended: "
    f"about {load[0] / cores:.1f} per core over the last minute. The two ranks want about one core each while "
    "they compute (gloo's threads a little more while they communicate), "
    + (
        "so most of that load was other work on this machine, and the steps below ran at a speed that moved with it."
        if load[0] > 2 * dist.get_world_size()
        else "so the load was mostly the ranks' own: the machine was otherwise quiet."
    ),
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
    "all_reduce bytes: what the step's calls reduce on one rank (01's m, summed over the calls).",
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
# * **non-compute** is time when only communication ran: one of gloo's threads was inside a
#   `gloo:*` range while the training thread computed nothing;
# * **idle** is the rest, when neither ran: the training thread's Python between `aten::` ops, its
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
# flight (and as non-compute while the training thread computes nothing), so a low overlap on a CPU
# says as much about the cores and the other rank as about the stage. On GPUs the same metrics read
# NCCL kernels against compute kernels, which run side by side.

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
            ax.text(stages.index(st) + 0.4 * (r - 0.5), y, "<1 %", ha="center", va="bottom", fontsize=7, rotation=90)
fig.suptitle("Each rank's own share, one profiled step per stage (loopback)")
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


def order(column, rk):
    """The synced stages from the most to the least `column` on rank `rk`."""
    return list(own[column].xs(rk, level="rank").sort_values(ascending=False).index)


lesson.say(
    f"Rank by rank, computation was {span(own['compute_pctg'].round(1))} of the synced stages' profiled steps, "
    f"{span(alone['compute_pctg'].round(1))} in single, which sends nothing. Non-compute ranges from "
    f"{at('non_compute_pctg', min)} to {at('non_compute_pctg', max)}, overlap from "
    f"{at('comm_comp_overlap_pctg', min)} to {at('comm_comp_overlap_pctg', max)}.",
)
waiting = [st for st in ("simple", "ga", "hook", "bucket") if st in own.index]
asynchronous = [st for st in ("hook-async", "bucket-async", "ddp", "torch") if st in own.index]
ov = own["comm_comp_overlap_pctg"]
split = ov[waiting].max() < ov[asynchronous].min()
lesson.say(
    *(
        f"Ranked by {name}, rank 0 orders the synced stages {' > '.join(order(column, 0))}, rank 1 "
        f"{' > '.join(order(column, 1))}: "
        + ("the same order." if order(column, 0) == order(column, 1) else "the two ranks rank them differently.")
        for name, column in (("overlap", "comm_comp_overlap_pctg"), ("non-compute", "non_compute_pctg"))
    ),
    ("What holds on both ranks is the coarse split" if split else "Not even the coarse split holds on both ranks")
    + f": the stages that wait for their messages ({', '.join(waiting)}) overlapped at most "
    f"{ov[waiting].max():.1f} %, the asynchronous ones ({', '.join(asynchronous)}) at least "
    f"{ov[asynchronous].min():.1f} %.",
)

# %% [markdown]
# `simple` and `ga` start communicating only after backward has ended, so what overlap they show is
# some of this rank's own `aten::` ops running while one of its gloo ranges is still open (overlap sets
# one rank's gloo ranges against that rank's own training thread only). The hook stages start
# communicating during backward, and the async ones do not block it while they do. One profiled step
# on a shared machine is a noisy sample of these percentages: read no finer order into them than the
# two ranks agree on, and look at the timeline below, which shows the mechanism itself.
#
# HTA's kernel-type view splits rank 0's *non-idle* time, the time something computed or
# communicated (the idle time left out, so `single` is 100 % computation), into computation alone,
# communication alone, and both at once; in % of that non-idle time. Its third column is not overlap
# (overlap divides the same time by the time in flight instead), as the sentence above the table shows.

# %%
kinds = {"COMPUTATION": "compute only", "COMMUNICATION": "communication only"}
kinds["COMPUTATION overlapping COMMUNICATION"] = "both at once"
both = result.kernels.set_index(["stage", "kernel_type"])["percentage"]
lesson.say(
    f"ddp's rank 0, for one: both at once is {both[('ddp', 'COMPUTATION overlapping COMMUNICATION')]:.1f} % of its "
    f"non-idle time, and its overlap {own.loc[('ddp', 0), 'comm_comp_overlap_pctg']:.1f} % of its time in flight."
)
result.kernels.pivot_table(index="stage", columns="kernel_type", values="percentage", sort=False).rename(
    columns=kinds
).round(1)

# %% [markdown]
# ## One step of each stage, on one time axis
#
# One row per profiled stage, one shared axis in milliseconds from the start of the profiled step (rank 0).
# In each row: the forward (pale) and backward (darker: the span defined above) of each micro-batch,
# a tick when a bucket was *handed to the wire* (its gradients all there: for minddp's stages its hook
# called, for torch's DDP, which has no hook range, the reducer's `c10d::allreduce_` call; `ready_us` in
# the tables below), an orange bar while its gloo all_reduce range was open (the legend's "collective in
# flight (held open included)"; per-parameter stages send one "bucket" per parameter; where dozens of narrow
# bars crowd, they merge into dark blocks; the parameter check's all_gather is not drawn), the *finish*
# (purple: `finish_gradient_synchronization()`, which the training loop calls after every backward; a
# short one is too thin to see), the optimizer (green) and the end of the step.
#
# Three shapes to tell apart:
#
# * **waiting after backward** (`simple` after every micro-batch, `ga` after the last): the ticks
#   and bars come after a backward band, and the step ends only when they are done;
# * **interleaving** (`hook`, `bucket`): ticks and bars inside the last backward band, the backward
#   standing still while each runs;
# * **asynchronous** (`hook-async`, `bucket-async`, `ddp`, `torch`): ticks inside the band, bars
#   running on while backward goes on; what is still running when backward ends is waited for before
#   the optimizer step (in the finish for `hook-async` and `bucket-async`, inside `loss.backward()` for
#   `ddp` and torch's DDP).
#
# Whatever a stage's last all_reduce leaves after its last backward is the *tail* in the table below.
#
# Orange is communication in every chart here (a gloo range in this one; the non-compute share in the
# link's chart further down).

# %%
fig = plot_timeline(result, RUN / "bucket_timeline.png")
display(Image(filename=RUN / "bucket_timeline.png"))

# %% [markdown]
# The numbers behind the plot, stage by stage (rank 0): how many buckets each sent in this step, how
# many were handed to the wire (`ready_us`) while a backward was still running, how long the last
# backward ran (the span defined above), the *tail* (how long after the last backward's end the last
# all_reduce before the optimizer ended: the verdict's `tail_us`, `docs/analysis.md`; for `simple` the
# last sync's only), and the step.

# %%
phases, buckets = result.phases[result.phases["rank"] == 0], result.buckets[result.buckets["rank"] == 0]
tails = result.per_step[result.per_step["rank"] == 0].groupby("stage")["tail_us"].last() / 1e3
rows = {}
for stage in [st for st in result.stages.index if st != "single"]:
    p, b = phases[phases["stage"] == stage], buckets[buckets["stage"] == stage]
    backward = p[p["phase"] == "backward"]
    during = sum(((backward["start_us"] <= t) & (t <= backward["end_us"])).any() for t in b["ready_us"])
    rows[stage] = {
        "buckets sent": len(b),
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
last_bw = anatomy["last backward, ms"]
quiet = [st for st in anatomy.index if anatomy.loc[st, "sent during a backward"] == 0]
busy = [st for st in anatomy.index if anatomy.loc[st, "sent during a backward"] > 0]
spread = per_stage.max() / per_stage.min()
longer = last_bw[busy].min() > spread * last_bw[quiet].max()  # every sender's longer than the forward moved
lesson.say(
    f"The forward passes (rank 0), the same work in every stage, took {per_stage.min() / 1e3:.0f}–"
    f"{per_stage.max() / 1e3:.0f} ms per step across the stages ({spread:.1f} ×); the stages ran one after the other.",
    f"The last backward computes the same gradients in every stage (its span also holds hook's and bucket's "
    f"waits for each message): it took {last_bw[quiet].min():.0f}–{last_bw[quiet].max():.0f} ms "
    f"in {' and '.join(quiet)}, which send nothing during it, and {last_bw[busy].min():.0f}–"
    f"{last_bw[busy].max():.0f} ms in the stages that send during it: "
    + (
        f"each of these more than {spread:.1f} × the longest of those, so in this run sending made backward longer."
        if longer
        else f"not every one of these more than {spread:.1f} × the longest of those (the forward's spread), so this "
        "run cannot tell what the sending cost."
    ),
)
ga, ha = anatomy.loc["ga"], anatomy.loc["hook-async"]
ga_sent = buckets[buckets["stage"] == "ga"]
lesson.say(
    f"ga sends its {ga['buckets sent']:.0f} messages after its last backward: its tail was {ga['tail, ms']:.0f} ms, "
    f"of which its all_reduces ran {(ga_sent['comm_end_us'].max() - ga_sent['comm_start_us'].min()) / 1e3:.0f} ms "
    "from the first one's start to the last one's end (the trace does not split the rest). hook-async sends the "
    f"same messages during backward; its tail was {ha['tail, ms']:.0f} ms."
)
late = buckets[buckets["comm_end_us"] > buckets["step_end_us"]]
if len(late):
    lesson.say(
        f"{len(late)} all_reduce range(s) end after their step did (by up to "
        f"{(late['comm_end_us'] - late['step_end_us']).max() / 1e3:.2f} ms); the axis runs past them."
    )

# %% [markdown]
# The table of one stage's buckets, as `RunAnalysis.buckets` holds it: `step`, the profiled step it
# belongs to; `order`, its place in the step's sending order; `bucket`, its index; `numel` and
# `dtype`, what it carried; `hook`, the comm hook that sent it; `launch`, what launched it (`hook`, or
# for torch's DDP `reducer`, whose `hook` column also reads `reducer`); times in µs from the start of
# the step: `ready_us`,
# handed to the wire (the hook called), `launched_us`, the hook returned (for torch's DDP both are the
# reducer's `c10d::allreduce_` call), `comm_*`, gloo's all_reduce range was open, `step_end_us`, the
# step's end. The first cell's "buckets of 4 MiB" is the size at which a bucket closes: parameters join
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
# On loopback, what a message costs is set by this machine's cores and whatever else runs on them (the
# first cell printed both; the cell below compares simple with single). A cluster's network has costs
# of its own, the same on every run. The first cell also profiled the blog's six stages with their
# gradients' all_reduces over the **emulated 1 Gbit/s link** that `03_build_up` introduced
# (`minddp.comm.link`: the real all_reduce runs beside the modeled transfer, and the message is
# delivered when both are done; the parameter check's all_gather does not go through the link). The
# link's transfers are in the traces as `minddp.link:all_reduce` ranges on a thread of their own, and
# the analysis counts them as communication.
#
# The link's trace also records when the training thread stood still for a message, so two more
# measures appear (`docs/analysis.md`): **waited**, the time the training thread stood waiting for a
# message, whether for the link, the other rank or a core, and **exposed**, the part of that wait
# during which the link's modeled transfer was still running.

# %%
from types import SimpleNamespace

import torch
from minddp.comm.link import parse_link
from minddp.costmodel.figures import ladder_on_link

r = result.stages
above = (r.loc["simple", "step_time_us"] - r.loc["single", "step_time_us"]) / 1e3
noise = per_rank.loc[per_rank["stage"] == "single", "step_ms"].agg(["min", "max"])
lesson.say(
    f"On loopback, here, simple's profiled step (mean of the two ranks) took {abs(above):.0f} ms "
    f"{'more' if above > 0 else 'less'} than single's, while single's two ranks, doing the same work without "
    f"communicating, took {noise['min']:.0f} and {noise['max']:.0f} ms: "
    + (
        "simple, which communicates, was the faster, so loopback steps cannot price communication here."
        if above < 0
        else f"single's two ranks differ by {noise['max'] - noise['min']:.0f} ms, at least as much, so loopback "
        "steps cannot price communication here."
        if noise["max"] - noise["min"] >= above
        else "more than single's ranks differ by, though the stages ran one after the other, so part of it can be "
        "the machine's speed moving between them."
    ),
)
LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked = analyze_run(LINKED)
link, world = parse_link("1gbit"), int(linked.summary["rank"].nunique())


def link_ms(stage):
    """The stage's *link time* (metrics.link_time): each all_reduce of rank 0's step modeled on the link, in ms."""
    sent = linked.buckets[(linked.buckets["rank"] == 0) & (linked.buckets["stage"] == stage)]
    size = {d: torch.empty(0, dtype=getattr(torch, d)).element_size() for d in sent["dtype"].unique()}
    return 1e3 * metrics.link_time(
        link, [("all_reduce", numel * size[d], world) for numel, d in zip(sent["numel"], sent["dtype"])]
    )


def pooled_overlap(run) -> pd.Series:
    """Each stage's overlap as docs/analysis.md pools it: both ranks' (and every step's) communication under
    compute over all of their time in flight, one ratio of sums (metrics.pooled_overlap_pct)."""
    rows = run.per_step
    return pd.Series(
        {
            stage: metrics.pooled_overlap_pct(zip(g["overlap_pctg"] / 100 * g["comm_time_us"], g["comm_time_us"]))
            for stage, g in rows.groupby("stage", sort=False)
        }
    )


waits = linked.per_step.groupby("stage")[["waited_us", "exposed_us"]].mean() / 1e3  # mean of the two ranks
on_link = linked.stages.assign(
    step_ms=linked.stages["step_time_us"] / 1e3,
    backward_ms=backward_ms(linked).groupby(level="stage").mean(),
    comm_comp_overlap_pctg=pooled_overlap(linked),
    non_compute_ms=linked.stages["non_compute_time_us"] / 1e3,
    waited_ms=waits["waited_us"],
    exposed_ms=waits["exposed_us"],
    link_ms=[link_ms(st) for st in linked.stages.index],
)
pooled = linked.stages.assign(comm_comp_overlap_pctg=on_link["comm_comp_overlap_pctg"])
chart = ladder_on_link(LINKED, analysis=SimpleNamespace(stages=pooled))  # the chart reads only `stages`
chart.axes[0].set_title("the ladder on 1gbit (measured): shares, mean of the two ranks; overlap, pooled")
chart.savefig(LINKED / "ladder_on_link.png", bbox_inches="tight")
display(Image(filename=LINKED / "ladder_on_link.png"))
on_link = on_link[
    ["step_ms", "backward_ms", "compute_pctg", "non_compute_pctg", "idle_pctg", "comm_comp_overlap_pctg"]
    + ["non_compute_ms", "waited_ms", "exposed_ms", "link_ms", "allreduce_calls_per_step"]
]
means = {"waited_ms": "waited (ms)", "exposed_ms": "exposed (ms)", "allreduce_calls_per_step": "all_reduce calls"}
means |= {"comm_comp_overlap_pctg": "overlap (%), pooled", "link_ms": "link time (ms, rank 0)"}
means |= {"non_compute_ms": "non-compute (ms)"}
display(on_link.rename(columns=NAMES | means).round(1))
ha = on_link.loc["hook-async"]
rk_ha = linked.summary[linked.summary["stage"] == "hook-async"].set_index("rank")[["non_compute_pctg"]]
rk_ha["non_compute_ms"] = (
    linked.summary[linked.summary["stage"] == "hook-async"].set_index("rank")["non_compute_time_us"] / 1e3
)
steps_ha = linked.per_step[linked.per_step["stage"] == "hook-async"].groupby("rank")[["waited_us", "exposed_us"]]
rk_ha[["waited_ms", "exposed_ms"]] = steps_ha.mean().to_numpy() / 1e3


def both_ranks(column, fmt="{:.0f}"):
    """hook-async's `column` on the link, "rank 0 / rank 1"."""
    return " / ".join(fmt.format(v) for v in rk_ha[column])


blocking = ["simple", "ga", "hook", "bucket"]  # the stages that wait for every message
times = on_link.loc[blocking, "waited_ms"] / on_link.loc[blocking, "link_ms"]
against = on_link.loc[blocking, ["waited_ms", "link_ms"]]
lesson.say(
    "In the chart and the table every column is the mean of the two ranks, but the overlap: that is the two "
    "ranks pooled as docs/analysis.md defines it (all their communication under compute over all their time "
    "in flight), and the link time, which is rank 0's messages priced on the link (both ranks send the same).",
    f"The link's modeled transfers are fixed by the messages' sizes: {on_link['link_ms'].min():.0f}–"
    f"{on_link['link_ms'].max():.0f} ms a step here, what Gigabit Ethernet would take for them by the α-β model, "
    f"the same on every run. The training thread's waits are not: in the stages that wait for every message "
    f"({', '.join(blocking)}) it waited {times.min():.1f}–{times.max():.1f} × the link time "
    f"({'; '.join(f'{st} {w:.0f} ms against {m:.0f}' for st, w, m in against.itertuples())}). "
    "A message is delivered when both its modeled transfer and gloo's real all_reduce are done, so a wait "
    "holds this machine's time as well as the link's.",
    f"On this link hook-async's overlap was {ha['comm_comp_overlap_pctg']:.1f} % (pooled); rank 0 / rank 1: "
    f"non-compute {both_ranks('non_compute_pctg', '{:.1f}')} % of the step ({both_ranks('non_compute_ms')} ms), "
    f"waited {both_ranks('waited_ms')} ms, exposed {both_ranks('exposed_ms', '{:.1f}')} ms (each by its one "
    "function in minddp.analysis.metrics). "
    "All describe the same step: exposed counts only the link's modeled transfers that the training thread "
    "stood waiting through (the measure 03 reports); waited, all its standing still for a message; non-compute, "
    "every moment a message was in flight (gloo's ranges and the link's transfers) while nothing computed; "
    "overlap, the share of the time in flight during which compute ran too. A gloo range held open while the "
    "training thread is not waiting adds non-compute time and lowers the overlap without being exposed.",
)

# %% [markdown]
# ## What each idea bought, here and on the blog's GPUs
#
# The blog this course follows measured its ladder on four T4 GPUs (its run, not one of this
# notebook's; its figures as it states them): its first DDP spent ~15 % of the GPU time not
# computing, with 0 % overlap; gradient accumulation brought non-compute to ~5 %, still 0 % overlap;
# hooks that wait for each all_reduce only interleaved (0 % overlap); async hooks brought
# non-compute to ~2 % with ~90 % overlap; buckets made no clear difference on top of that.
# Below, the same ideas on this machine, from the traces of this notebook, each idea as the step from
# one stage to the next, on the link: the calls (exact, the same on both ranks), where rank 0 sent its
# messages and their link time (exact: the modeled transfer of those calls and bytes), the step and the
# backward (the mean of the two ranks), and non-compute, overlap and exposed, each rank's own (rank 0 /
# rank 1), for one profiled step each. The blog compares async hooks with ga, not with hook, so the last
# column takes that step too. The stages ran one after the other, so their step and backward times carry
# the machine's speed of each moment: `docs/analysis.md` compares times only from steps taken in turns
# (`03_build_up` does); the cell after the table's says how far the speed moved during this run. Non-compute
# here holds the parameter check's all_gather ranges too (one at every sync: 3 a step in `simple`, 1 in the
# others, as the loopback table's all_gather calls show).

# %%
t = linked.stages  # the mean of the two ranks


def sent_in_backward(run, stage):
    """How many of the stage's messages were handed over during a backward (rank 0's trace)."""
    p = run.phases[(run.phases["rank"] == 0) & (run.phases["stage"] == stage) & (run.phases["phase"] == "backward")]
    b = run.buckets[(run.buckets["rank"] == 0) & (run.buckets["stage"] == stage)]
    return int(sum(((p["start_us"] <= x) & (x <= p["end_us"])).any() for x in b["ready_us"]))


def arrow(values, fmt="{:.0f}"):
    return " → ".join(fmt.format(v) for v in values)


mine = linked.summary.set_index(["stage", "rank"])  # each rank's own shares on the link
mine["exposed_ms"] = linked.per_step.groupby(["stage", "rank"])["exposed_us"].mean() / 1e3  # one profiled step


def by_rank(column, pair, fmt="{:.1f}"):
    """`column` on the link for each stage of `pair`, as "rank 0 / rank 1", before → after."""
    return arrow((" / ".join(fmt.format(mine.loc[(st, rk), column]) for rk in range(world)) for st in pair), "{}")


ideas = [
    ("accumulate, sync once per step", ["simple", "ga"], "~15 % → ~5 %", "0 % → 0 %"),
    ("sync from hooks, during backward", ["ga", "hook"], "~5 % → not given", "0 % → 0 % (interleaved)"),
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
            "step, ms (1 Gbit/s, mean of ranks)": arrow(on_link.loc[pair, "step_ms"]),
            "backward, ms (1 Gbit/s, mean of ranks)": arrow(on_link.loc[pair, "backward_ms"]),
            "non-compute % (1 Gbit/s), rank 0 / 1": by_rank("non_compute_pctg", pair),
            "overlap % (1 Gbit/s), rank 0 / 1": by_rank("comm_comp_overlap_pctg", pair),
            "exposed, ms (1 Gbit/s), rank 0 / 1": by_rank("exposed_ms", pair),
            "blog, 4 × T4: non-compute": blog_nc,
            "blog, 4 × T4: overlap": blog_ov,
        }
        for idea, pair, blog_nc, blog_ov in [*ideas, as_blog]
    }
)
display(summary)
nc = mine["non_compute_pctg"].unstack("rank")
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
    f"Accumulation divides the calls and the link time by the {k} micro-batches, exactly.",
)
lesson.claim(
    sent_in_backward(linked, "ga") == 0 and sent_in_backward(linked, "hook") == calls["hook"],
    "The hooks move every message from after the backward into it.",
)
sent = t["allreduce_bytes_per_step"]
lesson.claim(
    calls["bucket-async"] < calls["hook-async"]
    and sent["bucket-async"] == sent["hook-async"]
    and link_ms("bucket-async") < link_ms("hook-async"),
    f"Buckets cut the calls from {calls['hook-async']:.0f} to {calls['bucket-async']:.0f}, the bytes unchanged, "
    f"and so the link time from {link_ms('hook-async'):.1f} to {link_ms('bucket-async'):.1f} ms.",
)
ov, ex = mine["comm_comp_overlap_pctg"], on_link["exposed_ms"]
rose = [ov[("bucket-async", rk)] > ov[("hook-async", rk)] for rk in range(world)]
lesson.say(
    "On the link, bucket-async's overlap was "
    + " and ".join(f"{ov[('bucket-async', rk)]:.1f} % on rank {rk}" for rk in range(world))
    + ", hook-async's "
    + " and ".join(f"{ov[('hook-async', rk)]:.1f} %" for rk in range(world))
    + ": "
    + (
        f"the buckets' messages were in flight beside compute for a {'larger' if rose[0] else 'smaller'} share of "
        "their time on both ranks. "
        if len(set(rose)) == 1
        else "larger on one rank, smaller on the other, so one step does not say which overlaps more. "
    )
    + (
        f"Both exposed {ex['hook-async']:.1f} ms of link time (the mean of the ranks), so in this step exposed time "
        "shows no difference between them; 03's bucket lesson measures the two in turns, and says when buckets "
        "expose more."
        if round(ex["bucket-async"], 1) == round(ex["hook-async"], 1)
        else f"bucket-async exposed {ex['bucket-async']:.1f} ms of link time against hook-async's "
        f"{ex['hook-async']:.1f} ms (the mean of the ranks), {'more' if ex['bucket-async'] > ex['hook-async'] else 'less'}; "
        "03's bucket lesson measures the two in turns and takes the difference apart."
    )
)
fw = linked.phases[(linked.phases["rank"] == 0) & (linked.phases["phase"] == "forward")]
fw_ms = (fw["end_us"] - fw["start_us"]).groupby(fw["stage"]).sum() / 1e3
most_link = max(link_ms(st) for _, pair, *_ in ideas for st in pair)
slower = [idea for idea, pair, *_ in ideas if on_link.loc[pair[1], "step_ms"] > on_link.loc[pair[0], "step_ms"]]
lesson.say(
    f"On the link the forward passes, the same work in every stage, took {fw_ms.min():.0f}–{fw_ms.max():.0f} ms "
    f"per step (rank 0): they moved by {fw_ms.max() - fw_ms.min():.0f} ms from stage to stage, against a link time "
    f"of at most {most_link:.0f} ms a step, "
    + (
        "so a difference in the step and backward rows can come from the machine's speed alone. "
        if fw_ms.max() - fw_ms.min() > most_link
        else "yet the stages ran one after the other, so the step and backward rows still carry the machine's "
        "speed of each moment. "
    )
    + (
        f"In this run {len(slower)} of the {len(ideas)} ideas came out with a slower step ({'; '.join(slower)}), "
        "which by itself says nothing about them: "
        if slower
        else "In this run every idea came out with a faster step, which by itself says nothing about them: "
    )
    + "what each idea changed is in the calls, the link time and where the messages were sent."
)

# %% [markdown]
# Why the shares differ from the blog's (the counts and the link time are exact; the shares come
# from one step each, on the machine whose cores and load the first cell printed, and move from run
# to run):
#
# * **where communication runs**: on a GPU, NCCL's kernels run on their own stream beside the
#   compute kernels (the blog: ~90 % overlap). Here both ranks' training threads and gloo's threads
#   share this machine's CPU cores with whatever else runs on it: a collective needs a core that the
#   backward, or another process, may be using;
# * **what a communication range holds**: a `gloo:*` range is held open until the other rank
#   arrives, so a rank that is ahead counts its peer's lateness as communication;
# * **how dear the network is**: on the emulated link each message's modeled transfer takes what it
#   would on Gigabit Ethernet, the same on every run, but the training thread's waits hold this
#   machine's time as well (the link's table: waited against link time). `03_build_up` measures each
#   stage's exposed time on this link in turns, and asserts what its code guarantees;
# * **buckets**: what they save is the fixed cost 2(n−1)·α of each message they do not send (α: the
#   link's cost per hop before its bytes, `01_collectives`); what they cost in return, a first bucket
#   that leaves late in backward and a last one whose whole transfer comes after it, is the bucket
#   lesson at the end of `03_build_up`.
#
# For what the same stages would do at other link speeds and at 8 to 1024 ranks, see
# `docs/scaling.md` (`python -m minddp.model project`).
