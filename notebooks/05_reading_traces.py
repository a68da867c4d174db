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
# `chrome://tracing`). This notebook profiles one step of every stage, torch's DDP and the
# no-communication floor included, on the workload and settings every notebook shares, then reads
# the traces with `minddp.analysis` the way the blog this course follows reads its GPU traces with
# HolisticTraceAnalysis (HTA):
#
# * **temporal breakdown**: the share of the profiled time spent computing, communicating without
#   computing, and idle;
# * **overlap**: the share of communication time during which computation ran too;
# * **one step of every stage on one time axis**: forward and backward of each micro-batch, when
#   each bucket was handed to the wire, and when its all_reduce ran.
#
# HTA reads GPU traces only; on these CPU traces `minddp.analysis` computes the same metrics from
# the CPU events (definitions in `docs/analysis.md`).

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import shutil
from minddp.ladder import STAGES
from minddp.notebook import lesson
RUN = lesson.trace_dir("05_reading_traces")
if rank == 0:
    shutil.rmtree(RUN, ignore_errors=True)           # a fresh run folder: the analysis refuses mixed runs
dist.barrier()
profiled = ["single", *STAGES, "torch"]
for stage in profiled:
    lesson.Trainee(stage, warmup=0).profile(RUN, steps=1)   # a profiler warm-up step, then the recorded one
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
lesson.say(f"Profiled one step of each of: {', '.join(blog)} over an emulated 1gbit link, into "
           f"{LINKED.relative_to(lesson.ROOT)}.")

# %%
# %dist_shutdown

# %% [markdown]
# The ranks are done; the analysis runs here, in the notebook's own process. One row per (stage,
# rank) first: the two ranks of a stage should tell a similar story.

# %%
import pandas as pd
from IPython.display import Image, display
from minddp.analysis import analyze_run
from minddp.analysis.report import plot_overlap, plot_temporal, plot_timeline
from minddp.notebook import lesson

RUN = lesson.trace_dir("05_reading_traces")
result = analyze_run(RUN)
result.summary[["stage", "rank", "step_time_us", "compute_pctg", "non_compute_pctg", "idle_pctg",
                "comm_comp_overlap_pctg", "allreduce_calls_per_step", "allreduce_bytes_per_step"]].round(1)

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
# * **overlap** is the share of communication time during which the training thread computed.
#
# The caveat that decides how to read the communication numbers: a `gloo:all_reduce` range lasts
# from the moment gloo's thread picks the collective up until it is done, and that includes
# *waiting for the other rank* to arrive at the same collective and *waiting for a free core*
# (two ranks, their training threads and gloo's threads share two cores). So most of a `gloo:*`
# range is often waiting, not moving bytes, and a low overlap on a CPU says as much about the
# cores as about the stage. On GPUs the same metrics read NCCL kernels against compute kernels,
# which run side by side.

# %%
plot_temporal([result], RUN / "temporal_breakdown.png")
plot_overlap([result], RUN / "overlap.png")
display(Image(filename=RUN / "temporal_breakdown.png"), Image(filename=RUN / "overlap.png"))

# %%
s = result.stages
synced = [st for st in s.index if st != "single"]
lesson.say(f"Computation is {s['compute_pctg'].min():.0f}–{s['compute_pctg'].max():.0f} % of every stage's profiled "
           f"step (the floor, single: {s.loc['single', 'compute_pctg']:.0f} %): this workload is dominated by compute.",
           f"Non-compute ranges from {s.loc[synced, 'non_compute_pctg'].min():.1f} % "
           f"({s.loc[synced, 'non_compute_pctg'].idxmin()}) to {s.loc[synced, 'non_compute_pctg'].max():.1f} % "
           f"({s.loc[synced, 'non_compute_pctg'].idxmax()}), overlap from "
           f"{s.loc[synced, 'comm_comp_overlap_pctg'].min():.0f} % ({s.loc[synced, 'comm_comp_overlap_pctg'].idxmin()}) "
           f"to {s.loc[synced, 'comm_comp_overlap_pctg'].max():.0f} % ({s.loc[synced, 'comm_comp_overlap_pctg'].idxmax()}).")

# %% [markdown]
# By construction `simple` and `ga` start communicating only after backward has ended, so what
# overlap they show is incidental (the other rank still computing, gloo's thread and the optimizer
# sharing a moment); the hook stages start communicating during backward, and the async ones do
# not block it while they do. One profiled step on a shared machine is a noisy sample of these
# percentages: read them as a rough ranking, and look at the timeline below, which shows the
# mechanism itself.
#
# HTA's kernel-type view splits the profiled time the same way (percent of rank 0's profiled time):

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
#   in finish (for torch's DDP and `ddp`, inside `loss.backward()`).

# %%
fig = plot_timeline(result, RUN / "bucket_timeline.png")
display(Image(filename=RUN / "bucket_timeline.png"))

# %% [markdown]
# The numbers behind the plot, stage by stage: how many buckets each sent in this step, how many
# were handed to the wire while a backward was still running, and how long after the last backward
# the last all_reduce ended.

# %%
phases, buckets = result.phases[result.phases["rank"] == 0], result.buckets[result.buckets["rank"] == 0]
rows = {}
for stage in [st for st in result.stages.index if st != "single"]:
    p, b = phases[phases["stage"] == stage], buckets[buckets["stage"] == stage]
    backward = p[p["phase"] == "backward"]
    during = sum(((backward["start_us"] <= t) & (t <= backward["end_us"])).any() for t in b["ready_us"])
    last_end = backward["end_us"].max()
    rows[stage] = {"buckets sent": len(b), "sent during a backward": during,
                   "last backward, ms": (backward["end_us"].iloc[-1] - backward["start_us"].iloc[-1]) / 1e3,
                   "last all_reduce ended, ms after the last backward": (b["comm_end_us"].max() - last_end) / 1e3,
                   "step, ms": p.loc[p["phase"] == "step", "end_us"].max() / 1e3}
pd.DataFrame(rows).T.round(1)

# %%
forward = phases[phases["phase"] == "forward"]
per_stage = forward.groupby("stage")["end_us"].sum() - forward.groupby("stage")["start_us"].sum()
lesson.say(f"The forward passes, the same work in every stage, took {per_stage.min() / 1e3:.0f}–"
           f"{per_stage.max() / 1e3:.0f} ms per step across the stages: the stages were profiled one after the "
           f"other, and that spread is how much the machine's speed moved meanwhile. Compare the shapes of the rows; "
           f"for step times on equal terms, see the stages taking turns at the end of 03_build_up.")
late = buckets[buckets["comm_end_us"] > buckets["step_end_us"]]
if len(late):
    lesson.say(f"{len(late)} all_reduce range(s) end after their step did (by up to "
               f"{(late['comm_end_us'] - late['step_end_us']).max() / 1e3:.2f} ms): a gloo range closes when gloo's "
               f"thread has finished its own bookkeeping, which can be just after the training thread got the result "
               f"and moved on. The axis runs past them, so nothing is cut off.")
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
# Over loopback, moving a bucket between two ranks on one machine costs little next to the compute,
# so the stages above differ by a few percent. On a cluster's network it is another matter, and
# that is where the blog's story comes from. The first cell also profiled the blog's six stages with
# every collective over an **emulated 1 Gbit/s link** (`minddp.comm.link`): the real all_reduce
# still runs (the results are exact), and its Future completes no earlier than a ring all_reduce of
# that size would on such a network, one message at a time, as a network card sends them. The
# training thread is not held up by the emulation, so a stage that overlaps communication with
# backward hides the link's time just as it would on real hardware. The link's transfers are in the
# traces as `minddp.link:all_reduce` ranges on a thread of their own (look for the row
# "minddp link" in Perfetto), and the analysis counts them as communication.

# %%
from minddp.costmodel.figures import ladder_on_link

LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked = analyze_run(LINKED)
ladder_on_link(LINKED).savefig(LINKED / "ladder_on_link.png", bbox_inches="tight")
display(Image(filename=LINKED / "ladder_on_link.png"))
linked.stages[["step_time_us", "compute_pctg", "non_compute_pctg", "idle_pctg", "comm_comp_overlap_pctg",
               "allreduce_calls_per_step"]].round(1)

# %%
t = linked.stages
waited = t["non_compute_pctg"] + t["idle_pctg"]          # the share of the step not spent computing
lesson.say("Share of the profiled step not spent computing, over 1 Gbit/s: "
           + ", ".join(f"{st} {waited[st]:.0f} %" for st in t.index) + ".")
lesson.say(f"simple waits {waited['simple'] / max(waited['bucket-async'], 1e-9):.1f} times the share bucket-async "
           f"waits; bucket-async's step is {t.loc['bucket-async', 'step_time_us'] / 1e3:.0f} ms against simple's "
           f"{t.loc['simple', 'step_time_us'] / 1e3:.0f} ms, and {t.loc['bucket-async', 'comm_comp_overlap_pctg']:.0f} % "
           f"of its communication ran while backward computed (hook-async: "
           f"{t.loc['hook-async', 'comm_comp_overlap_pctg']:.0f} %, bucket: {t.loc['bucket', 'comm_comp_overlap_pctg']:.0f} %).")

# %% [markdown]
# Read it as the blog reads its GPU traces: `simple` sends every gradient after every micro-batch and
# waits for each; `ga` sends once per step; the hook stages start sending during backward, and the
# async ones keep computing while the link carries; buckets cut the number of messages, so the
# link's per-message latency is paid a few times instead of once per parameter. For what the same
# stages would do at other link speeds and at 8 to 1024 ranks, see `docs/scaling.md`
# (`python -m minddp.model project`).
