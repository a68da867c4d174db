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
# workload every notebook shares, with gloo over the machine's loopback interface (the *loopback run*:
# no emulated link). It reads the traces with `minddp.analysis` the way the blog this course follows
# ("First Steps With Distributed Data Parallelism and PyTorch Profiling", https://blog.underfit.ai/ddp-profiled)
# reads its GPU traces with HolisticTraceAnalysis (HTA), under HTA's names (`docs/analysis.md` defines
# every measure named here, each computed by its one function in `minddp.analysis.metrics`):
#
# * **in flight**: the time a communication range was open;
# * **overlap** (HTA's `comm_comp_overlap_pctg`): the share of the time in flight during which the
#   training thread computed (ran an `aten::` operator);
# * **non-compute**: the time in flight during which it computed nothing (ms); HTA's `non_compute_pctg`
#   is that time as a share of the step (the last table's first column).
#
# So non-compute = (100 % − overlap) × time in flight. Neither is the time the step lost to
# communication: non-compute also counts the training thread's own Python (its hooks, the time between
# autograd nodes) while a range is open, the stages' parameter check, and a range held open until the
# other rank joins it (below). Then **one step of each stage on one time axis**, and at the end the blog's six stages over an
# emulated 1 Gbit/s link (the *link run*), with two more measures, *waited* and *exposed* (defined there),
# and the link run set beside the blog's numbers.
#
# The letters are `01_collectives`' notation: n ranks, α the fixed cost of one hop of the ring, k the
# micro-batches of a step. A *message* here is one whole all_reduce call of gradients (a bucket's or a
# parameter's; the timeline's row labels count them), which on a ring makes 2(n−1) hops from each rank, so
# its fixed cost is 2(n−1)·α. The stages' parameter check (below) is a collective too, but not a message.
#
# HTA reads GPU traces only; on these CPU traces `minddp.analysis` computes measures of the same names
# from the CPU events, with what they count on a CPU (below), not what HTA counts on a GPU.

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
lesson.say(
    f"Profiled one step of each of: {', '.join(blog)} over an emulated 1gbit link, into "
    f"{LINKED.relative_to(lesson.ROOT)}."
)

# %%
# %dist_shutdown

# %% [markdown]
# ## Time in flight, overlap, non-compute
#
# The ranks are done; the analysis runs here, in the notebook's own process. Every table and figure below
# shows rank 0's trace. What the terms mean on this machine (CPU, gloo):
#
# * **compute** is the training thread inside an `aten::` operator (forward, backward, the optimizer,
#   the stages' copies into and out of buckets);
# * **in flight** is one of gloo's threads inside a `gloo:*` range: every collective, not only the
#   gradients'. minddp's stages `simple` to `bucket-async` also check, at every sync, that both ranks'
#   forwards used the same parameters (`minddp.stages.checks`: one all_gather a sync; `simple` syncs after
#   every micro-batch, the others once a step; `ddp` and torch's DDP run no such check);
# * **non-compute** is time in flight while the training thread ran no `aten::` op: standing in a wait for
#   a message or in the parameter check, running its own Python (hooks, the time between autograd nodes),
#   or ready to run with no core free.
#
# The caveat that decides how to read them: a gloo range lasts from the moment gloo's thread picks the
# collective up until it is done, so it is also *held open* until the other rank joins the same
# collective, and while gloo's thread waits for a core. On GPUs the same metrics read NCCL kernels
# against compute kernels, which run side by side. `single` has nothing in flight and is not in the table.
#
# The table's last column is the part of non-compute spent in the parameter check. The *blocking* stages
# (`simple`, `ga`, `hook`, `bucket`) wait for each message before they send the next: `simple` and `ga` after
# the backward, `hook` and `bucket` inside it. The *asynchronous* ones (`hook-async`, `bucket-async`, `ddp`,
# torch's DDP) send their messages during the backward and wait for them when it ends.

# %%
import pandas as pd
import matplotlib.pyplot as plt
from IPython.display import Image, display
from minddp.analysis import analyze_run, metrics
from minddp.analysis.cpu import rank_intervals
from minddp.analysis.events import load_stage
from minddp.analysis.steps import end_of
from minddp.analysis.timeline import draw_steps, rows_from_analysis
from minddp.notebook import lesson

RUN = lesson.trace_dir("05_reading_traces")
result = analyze_run(RUN)


def checks_of(stage, run=RUN):
    """Rank 0's profiled step of `stage`: its intervals, the step's start and its parameter checks' all_gather ranges
    (µs, on the trace's clock)."""
    iv = rank_intervals(load_stage(run / stage).ranks[0])
    _, s0, s1 = iv.steps[-1]
    return iv, s0, [(e["ts"], end_of(e)) for e in iv.allgathers if s0 <= e["ts"] <= s1]


def in_check(stage, run=RUN):
    """The stage's time in flight and its non-compute inside its parameter checks' ranges (rank 0), µs."""
    iv, _, checks = checks_of(stage, run)
    return metrics.in_flight(iv.comm, checks), metrics.non_compute([iv.steps[-1][1:]], iv.compute, checks)


zero = result.summary[(result.summary["rank"] == 0) & (result.summary["stage"] != "single")].set_index("stage")
check = pd.DataFrame([in_check(st) for st in zero.index], index=zero.index, columns=["flight", "non_compute"]) / 1e3
shares = pd.DataFrame(
    {
        "in flight (ms)": zero["comm_time_per_step_us"] / 1e3,
        "overlap (%)": zero["comm_comp_overlap_pctg"],
        "non-compute (ms)": zero["non_compute_time_us"] / 1e3,
        "of it, in the check (ms)": check["non_compute"],
    }
)
shares = shares.round(1)  # every sentence below reads these printed values
display(shares)
tied = (zero["non_compute_time_us"] - (1 - zero["comm_comp_overlap_pctg"] / 100) * zero["comm_time_per_step_us"]).abs()
# exact by the definitions (one profiled step: the step is the window); the margin is float rounding only
lesson.claim(
    (tied <= 1e-9 * zero["comm_time_per_step_us"] + 1e-3).all(),
    "For every stage, non-compute = (100 % − overlap) × in flight.",
)
waiting = ["simple", "ga", "hook", "bucket"]
asynchronous = ["hook-async", "bucket-async", "ddp", "torch"]
ov, fl = shares["overlap (%)"], shares["in flight (ms)"] - check["flight"].round(1)  # fl: in flight outside the check
outside = shares["non-compute (ms)"] - shares["of it, in the check (ms)"]
sizes = result.buckets[result.buckets["rank"] == 0].groupby("stage")["numel"].apply(sorted)
messages = sizes.map(len)
lesson.claim(
    sizes["bucket"] == sizes["bucket-async"],
    f"bucket and bucket-async send the same {messages['bucket']} messages (the same sizes).",
)
lesson.say(
    f"The blocking stages overlapped at most {ov[waiting].max():.1f} % in this step, the asynchronous ones at least "
    f"{ov[asynchronous].min():.1f} %. This run is not set beside the blog's numbers; the link run at the end is.",
    f"Outside the check, ga, which sends {messages['ga']} messages a step against simple's {messages['simple']}, "
    f"had {'less' if outside['ga'] < outside['simple'] else 'no less'} non-compute than simple: "
    f"{outside['ga']:.1f} against {outside['simple']:.1f} ms.",
    f"Outside the check, bucket's time in flight was {fl['bucket']:.1f} ms and bucket-async's "
    f"{fl['bucket-async']:.1f} ms for the same messages: in flight is how long gloo's ranges were open, held open "
    "included (above), not how long the bytes took to move.",
)

# %% [markdown]
# ## One step of each stage, on one time axis
#
# One row per profiled stage, one shared axis in milliseconds from the start of the profiled step (rank 0).
# In each row:
#
# * the forward (pale) and backward (darker) of each micro-batch (*backward*, here and in the tables below,
#   is the span from the first to the last autograd node of a micro-batch: the gradients' computation, and
#   whatever the hooks do inside those nodes: `hook`'s and `bucket`'s waits for each message, and in the
#   hooked stages the parameter check);
# * a tick when a message (a bucket's; a parameter's in the per-parameter stages) was *handed to the wire*:
#   for minddp's stages, where its send started the all_reduce (called from the finish in `simple` and `ga`,
#   from a hook in the others); for torch's DDP, the reducer's `c10d::allreduce_` call;
# * an orange bar while its gloo all_reduce range was open (the legend's "collective in flight (held open
#   included)"; where dozens of narrow bars crowd, they merge into one block, darker the narrower the bars,
#   whose edges are dark);
# * the parameter check (hatched red, the legend's "thread waits at a check"), drawn where gloo's all_gather
#   range of the check was open: the training thread stands in the check at least that long, until both
#   ranks have joined it (`ddp` and torch run none; a short one is too thin to see); the table above counts
#   that range in flight and, while the thread computes nothing in it, in non-compute (its last column);
# * the *finish* (purple, the legend's "finish (sync ends)": `finish_gradient_synchronization()`, which the
#   training loop calls after every backward; a short one is too thin to see), the optimizer (green) and the
#   end of the step.
#
# Three shapes to tell apart:
#
# * **blocking after backward** (`simple` after every micro-batch, `ga` after the last): the ticks
#   and bars come after a backward band, and the step ends only when they are done;
# * **blocking inside backward** (`hook`, `bucket`): ticks and bars inside the last backward band: each
#   hook waits for its message before backward goes on;
# * **asynchronous** (`hook-async`, `bucket-async`, `ddp`, `torch`): ticks inside the band, bars
#   running on while backward goes on; what is still running when the band ends is waited for before
#   the optimizer step: in the finish (purple) for `hook-async` and `bucket-async`; for `ddp` and torch's
#   DDP at the end of the `loss.backward()` call, after the band's last autograd node (nothing drawn there
#   on the thread's band: the gap between the backward and the optimizer).

# %%
rows = rows_from_analysis(result)  # the rows plot_timeline draws, plus each stage's parameter checks
for row in rows:
    _, s0, checks = checks_of(row["stage"])
    row["checks"] = [((a - s0) / 1e3, (b - s0) / 1e3) for a, b in checks]  # ms from the step's start
fig = draw_steps(rows, title=f"One step of each stage, on one time axis: run {result.run} (rank 0)", width=11)
fig.savefig(RUN / "one_step_each_stage.png", dpi=100)
plt.close(fig)  # shown once, from the file
display(Image(filename=RUN / "one_step_each_stage.png"))

# %% [markdown]
# The numbers behind the plot, stage by stage (rank 0): how many messages each sent in this step, how
# many were handed to the wire while a backward was still running, and how long the last backward ran.

# %%
phases, buckets = result.phases[result.phases["rank"] == 0], result.buckets[result.buckets["rank"] == 0]
rows = {}
for stage in zero.index:
    p, b = phases[phases["stage"] == stage], buckets[buckets["stage"] == stage]
    backward = p[p["phase"] == "backward"]
    during = sum(((backward["start_us"] <= t) & (t <= backward["end_us"])).any() for t in b["ready_us"])
    rows[stage] = {
        "messages sent": len(b),
        "sent during a backward": during,
        "last backward (ms)": round((backward["end_us"].iloc[-1] - backward["start_us"].iloc[-1]) / 1e3, 1),
    }
anatomy = pd.DataFrame(rows).T.astype({"messages sent": int, "sent during a backward": int})
anatomy

# %%
table = list(anatomy.index)  # the stages of the table (single, which sends nothing, is not in it)
forward = phases[(phases["phase"] == "forward") & phases["stage"].isin(table)]
per_stage = (forward["end_us"] - forward["start_us"]).groupby(forward["stage"]).sum() / 1e3
steps = phases[(phases["phase"] == "step") & phases["stage"].isin(table)].groupby("stage")["end_us"].max() / 1e3
last_bw = anatomy["last backward (ms)"]
quiet = [st for st in table if anatomy.loc[st, "sent during a backward"] == 0]
busy = [st for st in table if anatomy.loc[st, "sent during a backward"] > 0]
spread = per_stage.max() / per_stage.min()
over = int((last_bw[busy] > round(spread, 1) * last_bw[quiet].max()).sum())  # as printed
lesson.say(
    f"The forward passes, the same model and micro-batches in every stage, took {per_stage.min():.0f}–"
    f"{per_stage.max():.0f} ms per step ({per_stage.idxmin()}'s to {per_stage.idxmax()}'s, {spread:.1f} ×), and "
    f"the steps {steps.min():.0f}–{steps.max():.0f} ms: a difference in step time here does not price a stage's "
    "communication.",
    f"The last backward took {last_bw[quiet].min():.0f}–{last_bw[quiet].max():.0f} ms in {' and '.join(quiet)}, "
    f"which send nothing during it, and {last_bw[busy].min():.0f}–{last_bw[busy].max():.0f} ms in the stages "
    "that send during it (what their hooks do inside it included): "
    + (
        f"each of these more than {spread:.1f} × the longest of those, the forwards' spread."
        if over == len(busy)
        else f"{over} of these {len(busy)} took more than {spread:.1f} × the longest of those (the forwards' "
        "spread), so this run cannot tell what sending during backward cost."
    ),
)

# %% [markdown]
# One stage's buckets (`bucket-async`, rank 0), two of the columns of `RunAnalysis.buckets`: `order`, the
# bucket's place in the step's sending order; `numel`, the float32 numbers it carried (4 bytes each). The first
# cell's "buckets of 4 MiB" is the size at which a bucket closes: parameters join it until it holds 4 MiB or
# more (the one that crosses the line included), so a bucket can be a little over 4 MiB, and the last holds
# what is left:

# %%
buckets.loc[buckets["stage"] == "bucket-async", ["order", "numel"]].set_index("order").astype(int)

# %% [markdown]
# The same analysis from a shell, with an HTML report and its plots in the run folder:
# `python -m minddp.analyze traces/notebooks/05_reading_traces --report` (the folder holds the traces of
# the last time the first cell ran on your machine, not of the run whose outputs are saved here). On GPU
# traces the breakdown and overlap come from HTA itself.

# %% [markdown]
# ## The ladder on a slower network
#
# The first cell also profiled the blog's six stages with their gradients' all_reduces over the
# **emulated 1 Gbit/s link** that `03_build_up` introduced (`minddp.comm.link`: the real all_reduce runs
# beside the modeled transfer, and the message is delivered when both are done; the parameter check's
# all_gather does not go through the link). The link's transfers are in the traces as
# `minddp.link:all_reduce` ranges on a thread of their own, and the analysis counts them as communication:
# in this section in flight, overlap and non-compute count those ranges too. The link run and the loopback
# run are two runs taken at different moments on a shared machine; their times are not comparable.
#
# The link's trace also records when the training thread stood still for a message, so two more measures
# appear (`docs/analysis.md`): **waited**, the time the training thread stood in `wait()` on a gradient
# message, whether for the link, the other rank or a core, and **exposed**, the part of those waits during
# which the link was carrying a transfer (any message's). Waited is not all the time the thread stood still:
# the parameter check, where it also stands (the timeline's hatched "thread waits at a check"), is not a
# message, and waited does not count it. The *link time* is what rank 0's messages take on the modeled link
# (`metrics.link_time`), from their sizes alone.

# %%
import torch
from minddp.comm.link import parse_link

LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked = analyze_run(LINKED)
link, world = parse_link("1gbit"), int(linked.summary["rank"].nunique())
sent = linked.buckets[linked.buckets["rank"] == 0]
size = {d: torch.empty(0, dtype=getattr(torch, d)).element_size() for d in sent["dtype"].unique()}
nbytes = sent["numel"] * sent["dtype"].map(size)


def link_ms(stage):
    """The stage's *link time* (metrics.link_time): each all_reduce of rank 0's step modeled on the link, in ms."""
    return 1e3 * metrics.link_time(link, [("all_reduce", b, world) for b in nbytes[sent["stage"] == stage]])


ph = linked.phases[linked.phases["rank"] == 0]
bw = ph[ph["phase"] == "backward"]


def sent_in_backward(stage):
    """How many of the stage's messages were handed to the wire during a backward (rank 0's trace)."""
    p, b = bw[bw["stage"] == stage], sent[sent["stage"] == stage]
    return int(sum(((p["start_us"] <= x) & (x <= p["end_us"])).any() for x in b["ready_us"]))


lz = linked.summary[linked.summary["rank"] == 0].set_index("stage")
waits = linked.per_step[linked.per_step["rank"] == 0].groupby("stage")[["waited_us", "exposed_us"]].mean() / 1e3
on_link = pd.DataFrame(
    {
        "link time (ms)": [link_ms(st) for st in lz.index],
        "waited (ms)": waits["waited_us"],
        "exposed (ms)": waits["exposed_us"],
        "backward (ms)": (bw["end_us"] - bw["start_us"]).groupby(bw["stage"]).sum() / 1e3,
        "step (ms)": lz["step_time_us"] / 1e3,
    },
    index=lz.index,
).round(1)  # every sentence below reads these printed values
display(on_link)
blocking = ["simple", "ga", "hook", "bucket"]  # the stages that wait for each message before sending the next
exposed = on_link["exposed (ms)"]
after = on_link["waited (ms)"] - on_link["exposed (ms)"]
back, lt = on_link["backward (ms)"], on_link["link time (ms)"]
apart, link_apart = abs(back["simple"] - back["ga"]), lt["simple"] - lt["ga"]
lesson.say(
    f"Backward is every micro-batch's, added up. simple's and ga's, the same computation ("
    f"{sent_in_backward('simple')} and {sent_in_backward('ga')} messages handed to the wire during it), took "
    f"{back['simple']:.1f} and {back['ga']:.1f} ms: {apart:.1f} ms apart, against {link_apart:.1f} ms between their "
    "link times"
    + (
        ": within this run too, a difference in a stage's times does not price its communication."
        if apart > link_apart / 2
        else "."
    ),
    f"Exposed was {exposed[blocking].min():.1f}–{exposed[blocking].max():.1f} ms in the blocking stages, "
    f"{exposed['hook-async']:.1f} ms in hook-async and {exposed['bucket-async']:.1f} ms in bucket-async.",
    f"Waited minus exposed, time the thread waited while the link carried no transfer, ran from "
    f"{after.min():.1f} ms ({after.idxmin()}) to {after.max():.1f} ms ({after.idxmax()}, of its "
    f"{on_link.loc[after.idxmax(), 'waited (ms)']:.1f} ms waited).",
)


# %% [markdown]
# ## The link run beside the blog's numbers
#
# The blog named at the top measured its ladder on four T4 GPUs (its run, not one of this notebook's;
# its figures as it states them): its first DDP had ~15 % non-compute with 0 % overlap; gradient
# accumulation brought non-compute to ~5 %, still 0 % overlap; hooks that wait for each all_reduce, still
# 0 % overlap; async hooks brought non-compute to ~2 % with ~90 % overlap; buckets made no clear difference
# on top of that. Beside them, the link run's (rank 0, one profiled step of each stage), whose in flight
# holds the link's transfers and the parameter check's all_gather ranges too ("link included" in the
# headers; the second column is the part of non-compute spent in the parameter check, which the blog's DDP
# does not run; each stage's step is in the table above).
#
# Both measures share a name with the blog's, not a definition. The blog's (HTA's on GPU kernels):
# non-compute is the share of the step in which the GPU ran a communication (or copy) kernel and no compute
# kernel; overlap is the share of the communication kernels' time hidden under compute kernels. This
# notebook's: non-compute is the time a gloo or link range was open while the training thread ran no
# `aten::` op (here as a share of the step), which also counts its Python, the parameter check and its waits
# for the other rank or a core (the first section); overlap is the share of those ranges' open time in which
# it ran one.
#
# What buckets changed on top of async hooks in this run is printed below the table: the link time, and
# each asynchronous stage's last message against its backward's end (what of it is still on the link when
# the finish waits for it is waited for, the timeline's asynchronous shape). Whether they made the step
# faster, one profiled step of each stage cannot say (the section above sets simple's and ga's backward, the
# same computation, side by side).

# %%
linked_check = pd.Series({st: in_check(st, LINKED)[1] for st in lz.index})  # µs
blog_says = {
    "simple": ("~15", "0"),
    "ga": ("~5", "0"),
    "hook": ("not given", "0"),
    "hook-async": ("~2", "~90"),
    "bucket": ("not given", "not given"),
    "bucket-async": ("as async hooks", "as async hooks"),
}
ideas = pd.DataFrame(
    {
        "non-compute, link included (% of step)": lz["non_compute_pctg"].round(1),
        "of it, in the check (% of step)": (100 * linked_check / lz["step_time_us"]).round(1),
        "overlap, link included (%)": lz["comm_comp_overlap_pctg"].round(1),
        "blog: non-compute (%)": [blog_says[st][0] for st in lz.index],
        "blog: overlap (%)": [blog_says[st][1] for st in lz.index],
    },
    index=lz.index,
)
display(ideas)
calls = lz["allreduce_calls_per_step"].astype(int)
k = lesson.SETTINGS.grad_accum
lesson.claim(
    calls["simple"] == k * calls["ga"] and abs(link_ms("simple") - k * link_ms("ga")) < 1e-6 * link_ms("ga"),
    f"Accumulation divides the calls ({calls['simple']} → {calls['ga']}) and the link time "
    f"({link_ms('simple'):.1f} → {link_ms('ga'):.1f} ms) by k = {k}, the micro-batches of a step, exactly.",
)

lesson.claim(
    sent_in_backward("ga") == 0 and sent_in_backward("hook") == calls["hook"],
    f"The hooks move every message from after the backward into it (ga: {sent_in_backward('ga')} of "
    f"{calls['ga']} handed to the wire during a backward; hook: {sent_in_backward('hook')} of {calls['hook']}).",
)
fewer = calls["hook-async"] - calls["bucket-async"]
fixed = 2 * (world - 1) * link.latency * 1e3  # one message's fixed cost 2(n−1)·α, in ms
saved = link_ms("hook-async") - link_ms("bucket-async")
same = nbytes[sent["stage"] == "bucket-async"].sum() == nbytes[sent["stage"] == "hook-async"].sum()
lesson.claim(
    fewer > 0 and same and abs(saved - fewer * fixed) < 1e-9 * link_ms("ga"),
    f"Buckets cut the calls from {calls['hook-async']} to {calls['bucket-async']}, the bytes unchanged, "
    f"and so the link time from {link_ms('hook-async'):.1f} to {link_ms('bucket-async'):.1f} ms: {saved:.1f} ms, "
    f"the fixed cost of the {fewer} messages not sent, {fewer} × 2(n−1)·α = {fewer} × {2 * (world - 1)} × "
    f"{link.latency * 1e6:.0f} µs.",
)


def last_message(stage):
    """The stage's last message (rank 0): its numel, how long before the last backward ended it was handed to the
    wire and what it takes on the link, both in ms."""
    last = sent[sent["stage"] == stage].sort_values("ready_us").iloc[-1]
    ahead = (bw.loc[bw["stage"] == stage, "end_us"].max() - last["ready_us"]) / 1e3
    return int(last["numel"]), ahead, 1e3 * metrics.link_time(link, [("all_reduce", nbytes[last.name], world)])


(nh, ah, th), (nb, ab, tb) = last_message("hook-async"), last_message("bucket-async")
lesson.say(
    f"hook-async's last message, one parameter ({nh} numbers), was handed to the wire {ah:.1f} ms before its last "
    f"backward ended and takes {th:.1f} ms on the link; bucket-async's, its last bucket ({nb} numbers), {ab:.1f} ms "
    f"before and {tb:.1f} ms"
    + (
        ": the last bucket takes longer on the link than was left of the backward, the last parameter less"
        if th < ah and ab < tb
        else ""
    )
    + f" (exposed: {exposed['hook-async']:.1f} and {exposed['bucket-async']:.1f} ms)."
)

# %%
ov, nc = ideas["overlap, link included (%)"], ideas["non-compute, link included (% of step)"]
inside = ideas["of it, in the check (% of step)"]
told = {st: float(blog_says[st][0].lstrip("~")) for st in ["simple", "ga", "hook-async"]}
times = [nc[st] / told[st] for st in told]
order = "the blog's order" if nc["simple"] > nc["ga"] > nc["hook-async"] else "not the blog's order"
hook_ga = "above" if nc["hook"] > nc["ga"] else "not above"
lesson.say(
    f"Non-compute, simple to ga to hook-async: {nc['simple']:.1f}, {nc['ga']:.1f}, {nc['hook-async']:.1f} % (the "
    f"blog: ~15, ~5, ~2 %), {order}, {min(times):.1f} to "
    f"{max(times):.1f} × the blog's. hook's, {nc['hook']:.1f} %, is {hook_ga} ga's; outside the check, "
    f"{nc['hook'] - inside['hook']:.1f} against {nc['ga'] - inside['ga']:.1f} %.",
    f"The blocking stages overlapped at most {ov[blocking].max():.1f} %, the asynchronous ones at least "
    f"{ov[['hook-async', 'bucket-async']].min():.1f} % (the blog's overlap, another measure: 0 % and ~90 %).",
    f"hook-async and bucket-async overlapped {ov['hook-async']:.1f} and {ov['bucket-async']:.1f} % here, "
    f"{shares.loc['hook-async', 'overlap (%)']:.1f} and {shares.loc['bucket-async', 'overlap (%)']:.1f} % in the "
    "loopback run: "
    + (
        "the same order in both runs."
        if (ov["hook-async"] < ov["bucket-async"])
        == (shares.loc["hook-async", "overlap (%)"] < shares.loc["bucket-async", "overlap (%)"])
        else "one profiled step of each does not order them."
    ),
)
wa = on_link.loc["hook-async"]
nc_ms = nc["hook-async"] / 100 * wa["step (ms)"]
if wa["waited (ms)"] == 0:
    lesson.say(
        f"hook-async's thread never stood in wait() for a message (waited {wa['waited (ms)']:.1f} ms, exposed "
        f"{wa['exposed (ms)']:.1f} ms), yet {nc_ms:.1f} ms of its step was non-compute "
        f"({nc['hook-async']:.1f} % of {wa['step (ms)']:.1f} ms), {linked_check['hook-async'] / 1e3:.1f} ms of it in "
        "the check: the rest is time a range was open while the thread computed nothing and waited for no message, "
        "not time the step lost to the link."
    )
else:
    lesson.say(
        f"hook-async's thread waited {wa['waited (ms)']:.1f} ms for messages ({wa['exposed (ms)']:.1f} ms exposed), "
        f"against {nc_ms:.1f} ms of non-compute ({nc['hook-async']:.1f} % of its {wa['step (ms)']:.1f} ms step)."
    )

# %% [markdown]
# For what the same stages would do at other link speeds and at 2 to 1024 ranks, see
# `docs/scaling.md` (`python -m minddp.model project`).
