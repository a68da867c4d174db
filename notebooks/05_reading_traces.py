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
# `chrome://tracing`). This notebook profiles one step of every stage of the DDP ladder
# (`03_build_up`), torch's DDP and the no-communication floor included, on the workload and
# settings every notebook shares, then reads the traces with `minddp.analysis` the way the blog
# this course follows reads its GPU traces with HolisticTraceAnalysis (HTA). Two of its numbers
# both describe communication meeting computation; this notebook keeps HTA's names, and gives
# each one meaning only:
#
# * **non-compute** (HTA's temporal breakdown, `non_compute_pctg`): the share of the profiled time
#   when communication ran *and nothing computed*: communication the step could not hide;
# * **overlap** (HTA's `comm_comp_overlap_pctg`): the share of *communication* time during which
#   computation ran too: communication hidden. Only this one is called overlap here.
#
# They answer different questions over different totals: a stage can hide 90 % of its
# communication (overlap) and still spend 10 % of its step on the rest (non-compute), or hide
# none and spend 1 %. Then **one step of every stage on one time axis**, and at the end **what each
# idea bought**, here and on the blog's GPUs.
#
# HTA reads GPU traces only; on these CPU traces `minddp.analysis` computes the same metrics from
# the CPU events (definitions in `docs/analysis.md`).

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
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
    lesson.Trainee(stage, warmup=0).profile(RUN, steps=1)  # a profiler warm-up step, then the recorded one
lesson.say(lesson.describe())
lesson.say(f"Profiled one step of each of: {', '.join(profiled)}, into {RUN.relative_to(lesson.ROOT)}.")
# the blog's six stages again, every collective over an emulated 1 Gbit/s network (the last section)
LINKED = lesson.trace_dir("05_reading_traces_1gbit")
if rank == 0:
    shutil.rmtree(LINKED, ignore_errors=True)
dist.barrier()
blog = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
for stage in blog:
    lesson.Trainee(stage, warmup=0, link="1gbit").profile(LINKED, steps=1)
lesson.say(
    f"Profiled one step of each of: {', '.join(blog)} over an emulated 1gbit link, into "
    f"{LINKED.relative_to(lesson.ROOT)}."
)

# %%
# %dist_shutdown

# %% [markdown]
# The ranks are done; the analysis runs here, in the notebook's own process. One row per (stage,
# rank) first, with the step and the time backward ran (every micro-batch's). The two ranks of a
# stage do the same work, yet their shares need not agree: a gloo `all_reduce` range lasts until both
# ranks have arrived, so the rank that reaches a collective first counts its wait for the other as
# communication, while nothing computes. One rank waiting for the other is itself what a
# synchronizing step costs when the ranks are not in step; the cell below says where it was largest.

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
display(per_rank[shown].rename(columns=HEADERS).round(1))  # each measure's column under the measure's name
nc = per_rank.pivot(index="stage", columns="rank", values="non_compute_pctg").drop(index="single")
widest = (nc[0] - nc[1]).abs().idxmax()
waiter = int(nc.loc[widest].idxmax())
lesson.say(
    f"The ranks disagree most for {widest}: non-compute {nc.loc[widest, 0]:.1f} % of the step on rank 0, "
    f"{nc.loc[widest, 1]:.1f} % on rank 1: rank {waiter}'s gloo ranges stayed open while it computed nothing, "
    f"waiting inside the all_reduces for rank {1 - waiter} to arrive (or for a free core), which rank {1 - waiter} "
    "hardly did. The mean of the two "
    f"({nc.loc[widest].mean():.1f} %) describes neither rank; the figures below show each rank's own."
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
# * **idle** is the rest: the training thread waited (for a Future, a peer, a lock) and no
#   collective was running either;
# * **overlap** is the share of communication time during which the training thread computed
#   (the definition above).
#
# These are the measures `01_collectives` defines (`docs/analysis.md`: one function each in
# `minddp.analysis.metrics`); the analysis computes them with those functions.
#
# The caveat that decides how to read the communication numbers: a `gloo:all_reduce` range lasts
# from the moment gloo's thread picks the collective up until it is done, and that includes
# *waiting for the other rank* to arrive at the same collective and *waiting for a free core*
# (two ranks, their training threads and gloo's threads share two cores). So most of a `gloo:*`
# range is often waiting, not moving bytes, and a low overlap on a CPU says as much about the
# cores as about the stage. On GPUs the same metrics read NCCL kernels against compute kernels,
# which run side by side.

# %%
stages = list(result.stages.index)
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharex=True)
colors = {0: "#937860", 1: "#da8bc3"}  # the ranks: not orange, which is communication in every chart
for ax, column, label in (
    (axes[0], "non_compute_pctg", "non-compute, % of the step"),
    (axes[1], "comm_comp_overlap_pctg", "overlap, % of communication time"),
):
    table = per_rank.pivot(index="stage", columns="rank", values=column).loc[stages]
    for r in table.columns:
        ax.bar(
            [i + 0.4 * (r - 0.5) for i in range(len(stages))], table[r], width=0.4, label=f"rank {r}", color=colors[r]
        )
    ax.set_ylabel(label)
    ax.set_xticks(range(len(stages)), stages, rotation=35, ha="right")
    ax.set_ylim(0, 100)
axes[0].legend()
fig.suptitle("Each rank's own share, one profiled step per stage (loopback)")
fig.savefig(RUN / "per_rank.png", bbox_inches="tight")
plt.close(fig)
display(Image(filename=RUN / "per_rank.png"))

# %%
s = result.stages  # the mean of the two ranks
synced = [st for st in s.index if st != "single"]
least = s.loc[synced, "compute_pctg"].idxmin()
lesson.say(
    f"Averaged over the two ranks, computation is {s.loc[synced, 'compute_pctg'].min():.0f}–{s.loc[synced, 'compute_pctg'].max():.0f} % of the "
    f"synced stages' profiled steps (the floor, single: {s.loc['single', 'compute_pctg']:.0f} %); the least, "
    f"{least}, spends {100 - s.loc[least, 'compute_pctg']:.0f} % of its step communicating or waiting, on loopback.",
    f"Non-compute ranges from {s.loc[synced, 'non_compute_pctg'].min():.1f} % "
    f"({s.loc[synced, 'non_compute_pctg'].idxmin()}) to {s.loc[synced, 'non_compute_pctg'].max():.1f} % "
    f"({s.loc[synced, 'non_compute_pctg'].idxmax()}), overlap from "
    f"{s.loc[synced, 'comm_comp_overlap_pctg'].min():.0f} % ({s.loc[synced, 'comm_comp_overlap_pctg'].idxmin()}) "
    f"to {s.loc[synced, 'comm_comp_overlap_pctg'].max():.0f} % ({s.loc[synced, 'comm_comp_overlap_pctg'].idxmax()}).",
)

# %% [markdown]
# By construction `simple` and `ga` start communicating only after backward has ended, so what
# overlap they show is incidental (the other rank still computing, gloo's thread and the optimizer
# sharing a moment); the hook stages start communicating during backward, and the async ones do
# not block it while they do. One profiled step on a shared machine is a noisy sample of these
# percentages: read them as a rough ranking, and look at the timeline below, which shows the
# mechanism itself.
#
# HTA's kernel-type view splits rank 0's *non-idle* time, the time something computed or
# communicated (the idle time left out, so `single` is 100 % computation), into computation alone,
# communication alone, and both at once; in % of that time:

# %%
result.kernels.pivot_table(index="stage", columns="kernel_type", values="percentage", sort=False).round(1)

# %% [markdown]
# ## One step of every stage, on one time axis
#
# One row per stage, one shared axis in milliseconds from the start of the profiled step (rank 0).
# In each row: the forward (pale) and backward (darker) of each micro-batch, a tick when a bucket
# was handed to the wire, a bar while its all_reduce ran (per-parameter stages send one "bucket"
# per parameter), the finish and optimizer ranges under them, and the end of the step.
#
# Three shapes to tell apart:
#
# * **waiting after backward** (`simple` after every micro-batch, `ga` after the last): the ticks
#   and bars come after the last backward band, and the step ends only when they are done;
# * **interleaving** (`hook`, `bucket`): ticks and bars inside the last backward band, but each
#   one holds the backward up until it is done;
# * **overlapping** (`hook-async`, `bucket-async`, `ddp`, `torch`): ticks inside the band, bars
#   running on while backward goes on, and whatever is still running when backward ends waited for
#   before the optimizer step: in finish for the ladder's stages; for torch's DDP and `ddp`, at the
#   end of `loss.backward()`, after its last gradient (the table below says how long after).
#
# The colours are every step picture's: orange is communication (here a message on the wire; in
# the breakdowns above, the share of the step when only communication ran). These loopback traces
# record no link, so no wait is drawn (on an emulated link, `03_build_up` marks the training thread's
# waits in red).

# %%
fig = plot_timeline(result, RUN / "bucket_timeline.png")
display(Image(filename=RUN / "bucket_timeline.png"))

# %% [markdown]
# The numbers behind the plot, stage by stage (rank 0): how many buckets each sent in this step, how
# many were handed to the wire while a backward was still running, how long the last backward ran,
# the *tail* (how long after the last backward's end the last all_reduce before the optimizer ended:
# the verdict's `tail_us`, `docs/analysis.md`), and the step.

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
stretch = last_bw[busy].median() / last_bw[quiet].median()
longer = last_bw[busy].min() > last_bw[quiet].max() and stretch > spread
lesson.say(
    f"The forward passes, the same work in every stage, took {per_stage.min() / 1e3:.0f}–"
    f"{per_stage.max() / 1e3:.0f} ms per step across the stages ({spread:.1f} ×): the stages were profiled one "
    f"after the other, and that spread is how much the machine's speed moved meanwhile.",
    f"The last backward is the same work too, yet it took {last_bw[quiet].min():.0f}–{last_bw[quiet].max():.0f} ms "
    f"in {' and '.join(quiet)}, which send nothing during it, and {last_bw[busy].min():.0f}–"
    f"{last_bw[busy].max():.0f} ms in the stages that send during it (the medians {stretch:.1f} × apart): "
    + (
        "more than the machine's speed moved, so the sending itself made backward longer. hook and bucket wait "
        "for each message inside it; the other stages do not wait, but gloo's threads carrying their "
        "messages share this machine's two cores with both ranks' backward."
        if longer
        else "no more than the machine's speed moved, so this run cannot tell what the sending cost."
    ),
)
ga, ha = anatomy.loc["ga"], anatomy.loc["hook-async"]
lesson.say(
    f"What hiding cost the compute here: ga sends its {ga['buckets sent']:.0f} messages after its last backward, "
    f"and its last all_reduce ended {ga['tail, ms']:.0f} ms after it; hook-async sends the same messages during "
    f"backward, and its tail was {ha['tail, ms']:.0f} ms. Its last backward took {ha['last backward, ms']:.0f} ms "
    f"against ga's {ga['last backward, ms']:.0f}: "
    + (
        f"of the {ga['tail, ms'] - ha['tail, ms']:.0f} ms taken off the tail, "
        f"{ha['last backward, ms'] - ga['last backward, ms']:.0f} came back as backward time, gloo's threads "
        "carrying the messages having run on the two cores backward computes on"
        if ha["last backward, ms"] > ga["last backward, ms"] and longer
        else "longer, but the machine's speed moved as much from stage to stage (above), so this run cannot say "
        "how much of that the sending cost"
        if ha["last backward, ms"] > ga["last backward, ms"]
        else "no longer, on this run"
    )
    + f"; its step took {ha['step, ms']:.0f} ms against ga's {ga['step, ms']:.0f}. "
    "On a GPU the collectives run as NCCL kernels on a stream of their own while backward's kernels keep "
    "computing, so the same move shortens the step by about what it takes off the tail."
)
late = buckets[buckets["comm_end_us"] > buckets["step_end_us"]]
if len(late):
    lesson.say(
        f"{len(late)} all_reduce range(s) end after their step did (by up to "
        f"{(late['comm_end_us'] - late['step_end_us']).max() / 1e3:.2f} ms): a gloo range closes when gloo's "
        f"thread has finished its own bookkeeping, which can be just after the training thread got the result "
        f"and moved on. The axis runs past them, so nothing is cut off."
    )
else:
    lesson.say("Every all_reduce range ended before its step did.")

# %% [markdown]
# The table of one stage's buckets, as `RunAnalysis.buckets` holds it (times in µs from the start of
# the step; `ready_us`: handed to the hook, `launched_us`: the hook returned, `comm_*`: gloo ran the
# all_reduce):

# %%
buckets[buckets["stage"] == "bucket-async"].drop(columns=["rank", "stage"]).round(0)

# %% [markdown]
# The same analysis from a shell, with an HTML report and these plots in the run folder:
# `python -m minddp.analyze traces/notebooks/05_reading_traces --report`. On GPU traces the
# breakdown and overlap come from HTA itself.

# %% [markdown]
# ## The ladder on a slower network
#
# On loopback, what a message costs is set by this machine: its two cores, shared by both ranks'
# training threads and gloo's threads, and whatever else runs on it (the cell below says how much
# that was here). A cluster's network has costs of its own, the same on every run. The first cell
# also profiled the blog's six stages with every collective over the **emulated 1 Gbit/s link** that
# `03_build_up` introduced (`minddp.comm.link`: the real all_reduce runs, and completes no earlier
# than the modeled transfer). The link's transfers are in the traces as `minddp.link:all_reduce`
# ranges on a thread of their own (the row "minddp link" in Perfetto), and the analysis counts them
# as communication.

# %%
from minddp.costmodel.figures import ladder_on_link

r = result.stages
above = (r.loc["simple", "step_time_us"] - r.loc["single", "step_time_us"]) / 1e3
lesson.say(
    f"On loopback, here, simple's profiled step took {abs(above):.0f} ms {'more' if above > 0 else 'less'} than "
    f"single's, and its non-compute share was {r.loc['simple', 'non_compute_pctg']:.0f} %, ga's "
    f"{r.loc['ga', 'non_compute_pctg']:.0f} %."
)
LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked = analyze_run(LINKED)
ladder_on_link(LINKED, analysis=linked).savefig(LINKED / "ladder_on_link.png", bbox_inches="tight")
display(Image(filename=LINKED / "ladder_on_link.png"))
on_link = linked.per_step.groupby("stage")[["waited_us", "exposed_us"]].mean() / 1e3  # mean of the two ranks
on_link = linked.stages.assign(
    step_ms=linked.stages["step_time_us"] / 1e3,
    backward_ms=backward_ms(linked).groupby(level="stage").mean(),
    waited_ms=on_link["waited_us"],
    exposed_ms=on_link["exposed_us"],
)[
    ["step_ms", "backward_ms", "compute_pctg", "non_compute_pctg", "idle_pctg", "comm_comp_overlap_pctg"]
    + ["waited_ms", "exposed_ms", "allreduce_calls_per_step"]
]
display(on_link.rename(columns={**HEADERS, "waited_ms": "waited (ms)", "exposed_ms": "exposed (ms)"}).round(1))
ha = on_link.loc["hook-async"]
lesson.say(
    f"On this link hook-async's overlap was {ha['comm_comp_overlap_pctg']:.0f} % and its exposed time "
    f"{ha['exposed_ms']:.0f} ms (the mean of the two ranks, each by its one function in minddp.analysis.metrics). "
    "Both describe the same step: exposed counts only the link's modeled transfers that the training thread "
    "stood waiting through (the measure 03 reports), while overlap is the share of all communication time, gloo's "
    "ranges and the link's transfers, during which something computed; a gloo range that waits for the other "
    "rank, or runs after backward while the thread is not yet waiting, lowers the overlap without being exposed."
)

# %% [markdown]
# ## What each idea bought, here and on the blog's GPUs
#
# The blog this course follows measured its ladder on four T4 GPUs: its first DDP spent ~15 % of
# the GPU time not computing, with 0 % overlap; gradient accumulation brought non-compute to ~5 %,
# still 0 % overlap; hooks that wait for each all_reduce only interleaved (0 % overlap); async hooks
# brought non-compute to ~2 % with ~90 % overlap; buckets made no clear difference on top of that.
# Below, the same ideas on this machine, from the traces of this notebook: the counts (exact), the
# link's modeled time (exact: from the calls and bytes), and HTA's two shares, on loopback and on
# the emulated link, for one profiled step each. The blog's columns are its figures, as it states
# them.

# %%
import torch
from minddp.comm.link import parse_link

link, world = parse_link("1gbit"), int(linked.summary["rank"].nunique())
t, r = linked.stages, result.stages


def link_ms(stage):
    """The stage's *link time* (metrics.link_time): each all_reduce of rank 0's step modeled on the link, in ms."""
    sent = linked.buckets[(linked.buckets["rank"] == 0) & (linked.buckets["stage"] == stage)]
    size = {d: torch.empty(0, dtype=getattr(torch, d)).element_size() for d in sent["dtype"].unique()}
    return 1e3 * metrics.link_time(
        link, [("all_reduce", n * size[d], world) for n, d in zip(sent["numel"], sent["dtype"])]
    )


def sent_in_backward(run, stage):
    """How many of the stage's messages were handed over during a backward (rank 0's trace)."""
    p = run.phases[(run.phases["rank"] == 0) & (run.phases["stage"] == stage) & (run.phases["phase"] == "backward")]
    b = run.buckets[(run.buckets["rank"] == 0) & (run.buckets["stage"] == stage)]
    return int(sum(((p["start_us"] <= x) & (x <= p["end_us"])).any() for x in b["ready_us"]))


def arrow(values, fmt="{:.0f}"):
    return " → ".join(fmt.format(v) for v in values)


ideas = [
    ("accumulate, sync once per step", ["simple", "ga"], "~15 % → ~5 %", "0 % → 0 %"),
    ("sync from hooks, during backward", ["ga", "hook"], "~5 % → not given", "0 % → 0 % (interleaved)"),
    ("do not wait inside backward", ["hook", "hook-async"], "→ ~2 % (ga: ~5 %)", "0 % → ~90 %"),
    ("buckets", ["hook-async", "bucket-async"], "no clear difference", "no clear difference"),
]
summary = pd.DataFrame(
    {
        idea: {
            "stages": arrow(pair, "{}"),
            "all_reduce calls/step": arrow(t.loc[pair, "allreduce_calls_per_step"]),
            "sent during a backward": arrow(sent_in_backward(linked, s) for s in pair),
            "link time, ms (modeled, 1 Gbit/s)": arrow(link_ms(s) for s in pair),
            "step, ms (1 Gbit/s)": arrow(on_link.loc[pair, "step_ms"]),
            "backward, ms (1 Gbit/s)": arrow(on_link.loc[pair, "backward_ms"]),
            "non-compute % (loopback)": arrow(r.loc[pair, "non_compute_pctg"], "{:.1f}"),
            "non-compute % (1 Gbit/s)": arrow(t.loc[pair, "non_compute_pctg"], "{:.1f}"),
            "overlap % (1 Gbit/s)": arrow(t.loc[pair, "comm_comp_overlap_pctg"]),
            "exposed, ms (1 Gbit/s)": arrow(on_link.loc[pair, "exposed_ms"]),
            "blog, 4 × T4: non-compute": blog_nc,
            "blog, 4 × T4: overlap": blog_ov,
        }
        for idea, pair, blog_nc, blog_ov in ideas
    }
)
summary

# %%
calls = t["allreduce_calls_per_step"]
k = lesson.SETTINGS.grad_accum
lesson.claim(
    calls["simple"] == k * calls["ga"] and abs(link_ms("simple") - k * link_ms("ga")) < 1e-6 * link_ms("ga"),
    f"Accumulation divides the calls and the link time by the {k} micro-batches, exactly.",
)
lesson.claim(
    sent_in_backward(linked, "ga") == 0 and sent_in_backward(linked, "hook") == calls["hook"],
    "The hooks move every message from after the backward into it.",
)
lesson.claim(
    calls["bucket-async"] < calls["hook-async"] and link_ms("bucket-async") < link_ms("hook-async"),
    f"Buckets cut the calls from {calls['hook-async']:.0f} to {calls['bucket-async']:.0f}, and the link time "
    f"by their fixed cost only: {link_ms('hook-async') - link_ms('bucket-async'):.1f} ms of "
    f"{link_ms('hook-async'):.0f} ms.",
)
ov = t["comm_comp_overlap_pctg"]
lesson.say(
    f"On the link, bucket-async's overlap was {ov['bucket-async']:.0f} %, hook-async's {ov['hook-async']:.0f} %: "
    f"the buckets hid {'more' if ov['bucket-async'] > ov['hook-async'] else 'less'} of their communication "
    "(03's bucket lesson takes the difference apart)."
)

# %% [markdown]
# Why the shares differ from the blog's (the counts and the link time are exact; the shares come
# from one step each, on a 2-core machine shared with other work, and move from run to run):
#
# * **where communication runs**: on a GPU, NCCL's kernels run on their own stream beside the
#   compute kernels, so communication can hide behind computation almost entirely (the blog: ~90 %).
#   Here the two ranks, their training threads and gloo's threads share two CPU cores: a collective
#   needs a core that the backward may be using;
# * **what a communication range holds**: a `gloo:*` range also lasts while gloo waits for the
#   other rank to arrive, so a rank that is ahead counts its peer's lateness as communication;
# * **how dear the network is**: on loopback, what a message costs is set by this machine and what
#   else runs on it (the sentence above the link's chart); on the emulated link, communication
#   costs what it would on Gigabit Ethernet, the same on every run. 03 measures each stage's
#   exposed time on this link and asserts what its code guarantees (where each stage sends and
#   waits, accumulation's 1/k of the link time, async hooks exposing less than hooks that wait); its
#   exposed times need not fall rung by rung: hook can expose as much as ga (it waits for each
#   message inside backward), and bucket-async more than hook-async (03's bucket lesson says why);
# * **buckets**: what they save is the fixed cost 2(n−1)·α of each message they do not send (the
#   last claim above computes it on this link). What they cost in return, a first bucket that
#   leaves late in backward and a last bucket whose whole transfer comes after it, is the bucket
#   lesson at the end of `03_build_up`: both measured on this link, the cap swept beside the
#   step-time model, and the two async rungs compared in two of the blog's settings, its 4 × T4 and
#   its model at 1024 ranks, where every message makes 2(n−1) hops (`docs/scaling.md`).
#
# For what the same stages would do at other link speeds and at 8 to 1024 ranks, see
# `docs/scaling.md` (`python -m minddp.model project`).
