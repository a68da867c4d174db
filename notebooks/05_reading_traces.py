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
# are read in `06_sharding`), torch's DDP and `single` (each rank trains on its own, no communication), on the
# workload every notebook shares, with gloo over the machine's loopback interface (the *loopback run*:
# no emulated link). It reads the traces with `minddp.analysis` the way the blog this course follows
# ("First Steps With Distributed Data Parallelism and PyTorch Profiling", https://blog.underfit.ai/ddp-profiled)
# reads its GPU traces with HolisticTraceAnalysis (HTA): overlap and non-compute are HTA's names, *in flight*
# is this course's (`docs/analysis.md` defines these three measures and the link run's three below, each computed
# by its one function in `minddp.analysis.metrics`):
#
# * **in flight**: the time a communication range was open (what that counts here: below);
# * **overlap** (HTA's `comp_comm_overlap_pctg`): the share of the time in flight during which a
#   training thread computed (ran an `aten::` operator; which threads count as training threads: below);
# * **non-compute**: the time in flight during which none computed (ms).
#
# So non-compute = (100 % − overlap) × time in flight. Neither ranks the stages by speed. Non-compute counts more
# than a thread stopped until a message is back: also the threads' own Python (hooks, the time between
# autograd nodes) while a range is open, and the time in the stages' parameter check. A range held open
# until the other rank joins it (below) adds to non-compute the part of it in which no training thread computes,
# and to the overlap the part in which one computes. Then **one step of each stage on one time axis**, and at the end
# the blog's six stages over an emulated 1 Gbit/s link (the *link run*), with three more measures, *link time*,
# *waited* and *exposed* (defined there).
#
# The letters are `01_collectives`' notation: n ranks, α the fixed cost of one hop of the ring, β the time
# per byte on a link; and `03_build_up`'s k, the micro-batches of a step (the profiling cell prints it). A *message* here is one whole
# all_reduce call of gradients (a bucket's or a parameter's; the timeline's row labels count them), which on
# a ring makes 2(n−1) hops from each rank, so its fixed cost is 2(n−1)·α. A *sync* is one round of messages
# that carries every gradient once. The stages' parameter check (below) is a collective too, but not a message.
#
# HTA reads GPU traces only; on these CPU traces `minddp.analysis` computes measures of the same names
# from the CPU events, with what they count on a CPU (below), not what HTA counts on a GPU (kernels): the
# same names for different measures, so this notebook sets none of its numbers beside the blog's.

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
    # (the first step's one-off costs stay out, but for ddp's and torch's bucket plan rebuild, which comes
    # at the first forward after the first synced backward: the recorded step's), then the one step it records
    lesson.Trainee(stage, warmup=0).profile(RUN, steps=1)
lesson.say(lesson.describe())
lesson.say(lesson.machine(link=False))
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
    f"{LINKED.relative_to(lesson.ROOT)}; in this run the emulated link's thread shares the cores too."
)

# %%
# %dist_shutdown

# %% [markdown]
# ## Time in flight, overlap, non-compute
#
# The ranks are done; the analysis runs here, in the notebook's own process. Every table and figure below
# shows rank 0's trace. What to take from it: a gloo range's length here is how long it was open, held open
# included (the caveat below), not how long its bytes took. What the terms mean on this machine (CPU, gloo):
#
# * **compute** is a *training thread* inside an `aten::` operator (forward, backward, the optimizer,
#   the stages' copies into and out of buckets); `minddp.analysis` counts as a training thread every thread
#   that runs no `gloo:*` or `minddp.link:*` range (the Python thread, and the autograd engine's where it has
#   its own: `docs/analysis.md`), and the measures below count compute on any of them;
# * **in flight** is one of gloo's threads inside a `gloo:*` range: every collective, not only the
#   gradients' (the parameter check's and `ddp`'s and torch's broadcasts too, below);
# * **non-compute** is time in flight while no training thread ran an `aten::` op: stopped until a message
#   is back, in the parameter check or in `ddp`'s and torch's broadcasts, running its own Python (hooks, the
#   time between autograd nodes), or, where the threads outnumber the free cores, ready to run with none free.
#
# Three more terms:
#
# * the *finish* is minddp's `finish_gradient_synchronization()`, which the training loop calls after every
#   backward where the model has one (torch's DDP has none, and `ddp`'s finds its work done at the end of the
#   backward). `simple` syncs in the finish after every micro-batch, `ga` once a step;
# * the *parameter check* (`minddp.stages.checks`): once a sync, minddp's stages `simple` to `bucket-async` check
#   that both ranks' forwards used the same parameters, with one small all_gather: in `simple` and `ga` at the
#   start of the finish, in `hook` to `bucket-async` in the first gradient's hook. The check is minddp's, for
#   teaching: `ddp` and torch's DDP run none;
# * `ddp`'s and torch's *broadcasts*, `gloo:broadcast` ranges (no column or bar below gives their length): at the
#   step's first forward both broadcast the model's buffers from rank 0 (torch's `broadcast_buffers`, on by
#   default), and, once, at the forward after the first synced backward, which is the profiled step's first,
#   both rebuild their bucket plan in the order the gradients came, rank 0 broadcasting it (`minddp.ddp.plan`):
#   a one-off cost, inside the profiled step.
#
# The caveat that decides how to read them: a gloo range lasts from the moment gloo's thread picks the
# collective up until it is done, so it is also *held open* until the other rank joins the same
# collective, and while gloo's thread waits for a core; and it ends when gloo's thread leaves it, which can
# come after the waiting thread has had the result and gone on. On GPUs the same metrics read NCCL kernels
# against compute kernels, which run side by side. `single` has nothing in flight and is not in the table.
#
# The table's last two columns split non-compute in two: the part inside the parameter checks' all_gather ranges,
# all of the step's (`simple` checks at each of its k syncs, `ga` to `bucket-async` once, `ddp` and torch's DDP
# never; `lesson.non_compute_in_checks`), and the rest. The check carries one byte per parameter tensor, so a long check range is
# the time it was held open (until the other rank joined it, or gloo's thread had a core), not its bytes' time.
# The *blocking* stages (`simple`, `ga`, `hook`, `bucket`) send each message only once the one before
# it is back: `simple` and `ga` after a backward, `hook` and `bucket` inside the step's last backward. The
# *asynchronous* ones (`hook-async`, `bucket-async`, `ddp`, torch's DDP) send theirs during the step's
# last backward and need them back only when it ends. In `hook` to `bucket-async`, `ddp` and torch's DDP the step's
# first k−1 backwards send nothing (`no_sync`): one sync a step, as in `ga`.
#
# What the table does not show (rank 0's trace shows when a range was open, not why):
#
# * whether a difference between two rows would hold on a re-run: each row is one step, the stages were
#   profiled one after another on a shared machine, and this notebook does not measure how much one stage's
#   numbers move from run to run;
# * why stages that send as many messages (`bucket`, `bucket-async`, `ddp` and torch's DDP: the table after the
#   timeline counts them) differ in non-compute outside the check;
# * why one stage's check holds more non-compute than another's, nor whether the other rank or a core held it open;
# * what a blocking stage's thread computed in the time its overlap counts. It waits for each message before it
#   goes on, so that overlap is not computation beside a message still on its way; one way it can arise is the
#   caveat's last case, a range that ends after the waiting thread has had the result and gone on (to copy the
#   average into the gradient, or on with the backward). The trace does not say which operators ran in it.

# %%
import pandas as pd
import matplotlib.pyplot as plt
from IPython.display import Image, display
from minddp.analysis import analyze_run
from minddp.analysis.timeline import draw_steps, rows_from_analysis
from minddp.notebook import lesson

RUN = lesson.trace_dir("05_reading_traces")
result = analyze_run(RUN)
zero = result.summary[(result.summary["rank"] == 0) & (result.summary["stage"] != "single")].set_index("stage")
shares = pd.DataFrame(
    {
        "in flight (ms)": zero["comm_time_per_step_us"] / 1e3,
        "overlap (%)": zero["comm_comp_overlap_pctg"],
        "non-compute (ms)": zero["non_compute_time_us"] / 1e3,
        "of it, in the check (ms)": pd.Series({st: lesson.non_compute_in_checks(RUN, st) for st in zero.index}) / 1e3,
    }
).round(1)
# the rest, from the printed columns, so that it is their difference
shares["outside the check (ms)"] = (shares["non-compute (ms)"] - shares["of it, in the check (ms)"]).round(1)
display(shares)

# %% [markdown]
# Under the table, two claims and four printed lines. The first claim is true by the definitions (it checks their
# arithmetic on the unrounded values; worked by hand from the rounded columns it can miss in the last digits). The
# first line compares the two kinds by overlap in this run's steps (printed, not claimed: one step each decides it):
# a share of each stage's own time in flight, which counts its check range too, not a time, so it does not say which
# stage has the shorter non-compute. The second claim is true by construction (both stages plan their buckets with
# `minddp.stages.bucket_plan`). The next line prints the in flight of the stages that send as many messages, each
# with its step's other collectives (the check in `bucket` and `bucket-async`, the broadcasts in `ddp` and torch's
# DDP), so it does not rank their messages' ranges. The last two print first whether the check holds more than half of
# any stage's non-compute, then each change's two stages by non-compute, with and without the check: one step
# against another, not shown to hold on a re-run.

# %%
tied = (zero["non_compute_time_us"] - (1 - zero["comm_comp_overlap_pctg"] / 100) * zero["comm_time_per_step_us"]).abs()
# exact by the definitions (one profiled step: the step is the window); the margin is float rounding only
lesson.claim(
    (tied <= 1e-9 * zero["comm_time_per_step_us"] + 1e-3).all(),
    "For every stage, non-compute = (100 % − overlap) × in flight.",
)
blocking, asynchronous = ["simple", "ga", "hook", "bucket"], ["hook-async", "bucket-async", "ddp", "torch"]
lesson.say(  # printed, not claimed: one profiled step per stage on a shared machine decides it
    "In this step each, "
    + (
        "every blocking stage's overlap is below every asynchronous stage's"
        if zero.loc[blocking, "comm_comp_overlap_pctg"].max() < zero.loc[asynchronous, "comm_comp_overlap_pctg"].min()
        else "the blocking stages' overlaps are not all below the asynchronous stages'"
    )
    + f" ({zero.loc[blocking, 'comm_comp_overlap_pctg'].max():.1f} % at most against "
    f"{zero.loc[asynchronous, 'comm_comp_overlap_pctg'].min():.1f} % at least)."
)
sizes = result.buckets[result.buckets["rank"] == 0].groupby("stage")["numel"].apply(sorted)
lesson.claim(
    sizes["bucket"] == sizes["bucket-async"],
    f"bucket and bucket-async send the same {len(sizes['bucket'])} messages (the same sizes).",
)
flight, sends = shares["in flight (ms)"], result.buckets[result.buckets["rank"] == 0].groupby("stage").size()
alike = [st for st in zero.index if sends.get(st) == len(sizes["bucket"])]
lesson.say(
    f"The stages that send {len(sizes['bucket'])} messages each, in flight: "
    + ", ".join(f"{st} {flight[st]:.1f} ms" for st in alike)
    + " (each with its other collectives: the parameter check in bucket and bucket-async, broadcasts in ddp and torch)."
)
nc, inside, rest = (shares[c] for c in ["non-compute (ms)", "of it, in the check (ms)", "outside the check (ms)"])
most = [f"{st} ({100 * inside[st] / nc[st]:.0f} %)" for st in nc.index if inside[st] > nc[st] / 2]
lesson.say(
    f"In this step the parameter check holds more than half of the non-compute of {', '.join(most)}."
    if most
    else "In this step the parameter check holds at most half of every stage's non-compute."
)
lesson.say(
    "Each change's two stages by non-compute, then outside the check: "
    + "; ".join(
        f"{a}'s is {lesson.compared(nc[a], nc[b])} {b}'s ({nc[a]:.1f} against {nc[b]:.1f} ms), outside the check "
        f"{lesson.compared(rest[a], rest[b])} {b}'s ({rest[a]:.1f} against {rest[b]:.1f} ms)"
        + (": the order turns around" if (nc[a] - nc[b]) * (rest[a] - rest[b]) < 0 else "")
        for a, b in [
            ("ga", "simple"),
            ("hook", "ga"),
            ("bucket", "hook"),
            ("hook-async", "hook"),
            ("bucket-async", "bucket"),
            ("bucket-async", "hook-async"),
        ]
    )
    + "."
)

# %% [markdown]
# ## One step of each stage, on one time axis
#
# One row per profiled stage, one shared axis in milliseconds from the start of the profiled step (rank 0; a row's
# white before its first forward band is the step's time before its first micro-batch). `single` sends nothing.
# A row's length does not rank its stage: each row is one step, and the same work (a forward, a backward, the
# optimizer step) takes different times from row to row. In each row:
#
# * the forward (pale) and backward (darker) of each micro-batch (the *forward* band is the span from the
#   micro-batch's start to its first autograd node: the forward, and whatever the stage does around it, such
#   as `ddp`'s and torch's broadcasts; the *backward* band is the span from the first to the last
#   autograd node: the gradients' computation, and whatever the hooks do inside those nodes: in `hook` and
#   `bucket` the time until each message is back, and in `hook` to `bucket-async` the parameter check);
# * a tick when a message was *handed to the wire* (the legend's words; the tables' *sent*; in this run the wire is
#   gloo over the loopback interface): for minddp's stages, the start of its
#   `minddp.bucket_launch` range (from the finish in `simple` and `ga`, from a hook in the others), before it calls
#   the all_reduce; for torch's DDP, the reducer's `c10d::allreduce_` call;
# * an orange bar while its gloo all_reduce range was open (the legend's "all_reduce range (held open
#   included)"): the messages' ranges only, a part of the table's in flight, which also counts the check's
#   all_gather (hatched, below) and `ddp`'s and torch's broadcasts (no bar). A message's bar is the range matched
#   to its `c10d::allreduce_` call, the first of the same size that opened at or after the call, which comes at or
#   after the tick; so no bar starts before its tick, but one can start later (the table after the figure prints,
#   per stage, the longest time from a tick to its bar), and a tick at a bar's left end need not be that bar's own.
#   A row's bars alternate two shades of orange in the order they opened, with no edge line, the dark ones drawn
#   over the light. Bars can overlap (a range can open while another is still open), so a dark bar can hide a
#   light bar's start, the start a tick-to-bar time ends at. A bar or a gap narrower than a pixel need not show, so
#   a row can show fewer bars than its label counts messages, and bars that touch or overlap can look like one
#   block. Read the time in flight off the table above, not off the bars;
# * the parameter check (hatched red), drawn where gloo's all_gather range of the check was open, over the top half
#   of the row's bands: gloo's thread's range, not the training thread's stand in the check, which need not start
#   or end with it (the caveat above). `ddp` and torch run none; a short one is too thin to see. In `hook` to
#   `bucket-async` it runs in the first gradient's hook, so it falls inside the last backward band. The table above
#   counts that range in flight and, while no training thread computes in it, in non-compute (its column "of it,
#   in the check");
# * the finish (purple: the `finish_gradient_synchronization()` call, inside which `simple` and `ga` run their
#   whole sync), drawn, however long, as a thin strip along the bands' lower edge; a short one does not show; the
#   optimizer step (green) and the end of the step.
#
# Three shapes to tell apart:
#
# * **blocking after backward** (`simple` after every micro-batch, `ga` after the last): the ticks
#   and bars come after a backward band, and the step ends only when they are done;
# * **blocking inside backward** (`hook`, `bucket`): ticks and bars inside the last backward band: each
#   hook holds the backward until its message is back (the band includes that time; a bar inside the band is not
#   overlap: overlap counts only training threads' `aten::` operators);
# * **asynchronous** (`hook-async`, `bucket-async`, `ddp`, `torch`): ticks inside the last backward band, bars
#   running on while backward goes on; what is still running when the band ends must be back before
#   the optimizer step: in the finish (purple) for `hook-async` and `bucket-async`; for `ddp` and torch's
#   DDP at the end of the `loss.backward()` call, after the band's last autograd node (nothing drawn there
#   on the thread's band: the gap between the backward and the optimizer).

# %%
rows = rows_from_analysis(result)  # the rows plot_timeline draws, plus each stage's parameter checks
for row in rows:
    _, s0, checks = lesson.parameter_checks(RUN, row["stage"])
    row["checks"] = [((a - s0) / 1e3, (b - s0) / 1e3) for a, b in checks]  # ms from the step's start
fig = draw_steps(rows, title=f"One step of each stage, on one time axis: run {result.run} (rank 0)", width=11)
fig.savefig(RUN / "one_step_each_stage.png", dpi=100)
plt.close(fig)  # shown once, from the file
display(Image(filename=RUN / "one_step_each_stage.png"))

# %% [markdown]
# The numbers behind the plot, stage by stage (rank 0): how many messages each sent (handed to the wire, a
# tick) in this step, how many of them during a backward, and the longest time from a message's tick to the start
# of its bar.

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
        "tick to bar, at most (ms)": (b["comm_start_us"] - b["ready_us"]).max() / 1e3,
    }
anatomy = pd.DataFrame(rows).T.astype({"messages sent": int, "sent during a backward": int})
anatomy.round(1)


# %%
def phase_ms(phase):
    """Each profiled stage's time in `phase` (its spans added up; rank 0's step), ms; `single` included."""
    part = phases[phases["phase"] == phase]
    return (part["end_us"] - part["start_us"]).groupby(part["stage"]).sum() / 1e3


def spread(ms):
    """The least and the most of `ms` over the stages (to the ms), whose, and the ratio of those two printed values."""
    lo, hi = round(ms.min()), round(ms.max())
    return f"{lo}–{hi} ms ({ms.idxmin()}'s to {ms.idxmax()}'s, {hi / lo:.1f} ×)"


lesson.say(
    "Every stage, `single` included, trains the same model on the same micro-batches with AdamW. The optimizer step, the same "
    f"work in every stage, took {spread(phase_ms('optimizer'))}, in one profiled step each. "
    "Why it took longer in one stage's step than in another's the trace does not show: every row's ranks shared the same "
    "cores, and the trace records when each operator ran, not what held it back."
)

# %% [markdown]
# One stage's buckets (`bucket-async`, rank 0), two of the columns of `RunAnalysis.buckets`: `order`, the
# bucket's place in the step's sending order; `numel`, the float32 numbers it carried (4 bytes each). The "buckets
# of 4 MiB" that the profiling cell (the `%%distributed` cell at the top) printed is the size at which a bucket
# closes: parameters join it until it holds 4 MiB or more (the one that crosses the line included), so a bucket
# can be a little over 4 MiB, and the last holds what is left:

# %%
buckets.loc[buckets["stage"] == "bucket-async", ["order", "numel"]].set_index("order").astype(int)

# %% [markdown]
# The same analysis from a shell, with an HTML report and its plots in the run folder:
# `python -m minddp.analyze traces/notebooks/05_reading_traces --report` (the folder holds the traces of
# the last time the profiling cell ran on your machine, not of the run whose outputs are saved here). Its report
# ranks the stages by non-compute and by step time, one profiled step each: non-compute does not rank them by
# speed, and neither ranking is shown to hold on a re-run. On GPU traces, overlap and non-compute come from HTA
# itself.

# %% [markdown]
# ## The ladder on a slower network
#
# The profiling cell also profiled the blog's six stages with their gradients' all_reduces over the
# **emulated 1 Gbit/s link** that `03_build_up` introduced (`minddp.comm.link`: each rank has its own, which carries
# its messages one at a time, in order; the real all_reduce runs beside the modeled transfer, and a message is
# delivered when both are done and every earlier one is delivered; the parameter check's
# all_gather does not go through the link: `minddp.stages.checks` calls `dist.all_gather`, not the
# stage's comm hook). The link's transfers are in the traces as
# `minddp.link:all_reduce` ranges on a thread of their own. The link run and the loopback run were
# taken at different moments on a shared machine; their times are not comparable. Three measures
# (`docs/analysis.md`):
#
# * **link time**: what rank 0's messages of a step take on the modeled link, from their sizes alone
#   (`metrics.link_time`): 2(n−1)·α + 2(n−1)/n·m·β for a message of m bytes, added up, with the `1gbit`
#   preset's α = 50 µs and β = 8 ns a byte (1 Gbit/s). It is the link's
#   work, not time the step lost;
# * **waited**: the time from rank 0's first `wait()` on a gradient message to the message's
#   delivery (its modeled transfer and the real all_reduce both done), whether it waited for the link, the
#   other rank or a core; the thread's own return from `wait()` after the delivery is not counted. The
#   parameter check is not a message, and waited does not count it;
# * **exposed**: the part of those waits during which rank 0's link was carrying a transfer (any message's). The
#   part of the transfers that passes while the thread is in no wait is in neither waited nor exposed, so both
#   can fall short of the link time, even in a blocking stage. Waited minus exposed (the table's last column) is the part of the waits during which rank 0's link carried nothing
#   (rank 1's could be carrying).
#   Exposed is not time the step lost to the link either, nor what a free link would save (`metrics.exposed`):
#   with no transfer, the other rank's waits and its sends would change too.

# %%
from minddp.analysis import metrics
from minddp.comm.link import parse_link

LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked = analyze_run(LINKED)
link, world = parse_link("1gbit"), int(linked.summary["rank"].nunique())
sent = linked.buckets[linked.buckets["rank"] == 0]
assert (sent["dtype"] == "float32").all()
nbytes = sent["numel"] * 4  # float32: 4 bytes a number


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
    },
    index=lz.index,
).round(1)
# from the printed columns, so that it is their difference
on_link["waited − exposed (ms)"] = (on_link["waited (ms)"] - on_link["exposed (ms)"]).round(1)
display(on_link)

# %% [markdown]
# What accumulation, hooks and buckets change by construction: the messages' count, where they are handed to
# the wire, the link time (the first three claims below). The link time is set by the messages' count and bytes;
# how long a stage waited for them also depends on when it handed them over and when it waited, which the link
# time does not decide. The waited column gives that, one profiled step per stage, so a difference between two
# rows need not hold on a re-run. The lines under the claims print, one step each (printed, not claimed): the two
# kinds compared by waited (`ddp` and torch's DDP were not run over the link); for each asynchronous stage, the
# link time of the last message it handed over beside its waited (not a floor on it: waited starts at the first
# `wait()`, and the transfer can start before); how much of the link time buckets saved, all they change on the
# link (a larger change in waited is not shown to come from buckets); each change's two stages by waited and
# exposed; each stage's waited as a share of its link time, and the stages that waited longer than it (waited −
# exposed, in the table, is the part with rank 0's link carrying nothing); from `hook` to `bucket`,
# how the change in waited splits between exposed and waited − exposed, beside the change in link time (the signs
# give each change's direction, the ratio only their sizes); last, a line for each stage whose exposed, to one
# decimal, is zero while its waited is not, if any.

# %%
sends_1g = sent.groupby("stage").size()  # the messages: minddp.bucket_launch ranges, as in the table above
k = lesson.SETTINGS.grad_accum
lesson.claim(
    sends_1g["simple"] == k * sends_1g["ga"] and abs(link_ms("simple") - k * link_ms("ga")) < 1e-6 * link_ms("ga"),
    f"Accumulation divides the messages ({sends_1g['simple']} → {sends_1g['ga']}) and the link time "
    f"({link_ms('simple'):.1f} → {link_ms('ga'):.1f} ms) by k = {k}, the micro-batches of a step, exactly.",
)

lesson.claim(
    sent_in_backward("ga") == 0 and sent_in_backward("hook") == sends_1g["hook"],
    f"The hooks move every message from after the backward into it (ga: {sent_in_backward('ga')} of "
    f"{sends_1g['ga']} handed to the wire during a backward; hook: {sent_in_backward('hook')} of {sends_1g['hook']}).",
)
fewer = sends_1g["hook-async"] - sends_1g["bucket-async"]
fixed = 2 * (world - 1) * link.latency * 1e3  # one message's fixed cost 2(n−1)·α, in ms
saved = link_ms("hook-async") - link_ms("bucket-async")
same = nbytes[sent["stage"] == "bucket-async"].sum() == nbytes[sent["stage"] == "hook-async"].sum()
lesson.claim(
    fewer > 0 and same and abs(saved - fewer * fixed) < 1e-9 * link_ms("ga"),
    f"Buckets cut the messages from {sends_1g['hook-async']} to {sends_1g['bucket-async']}, the bytes unchanged, "
    f"and so the link time from {link_ms('hook-async'):.1f} to {link_ms('bucket-async'):.1f} ms: {saved:.1f} ms, "
    f"the fixed cost of the {fewer} messages not sent, {fewer} × 2(n−1)·α = {fewer} × {2 * (world - 1)} × "
    f"{link.latency * 1e6:.0f} µs.",
)
stood = waits["waited_us"]  # ms
slow, quick = stood[[s for s in blocking if s in stood.index]], stood[[s for s in asynchronous if s in stood.index]]
lesson.say(  # printed, not claimed: one profiled step per stage on a shared machine decides it
    f"In this step each, the link run's asynchronous stages ({', '.join(quick.index)}) "
    + ("each waited less" if quick.max() < slow.min() else "did not all wait less")
    + f" for their messages than every blocking one ({quick.max():.1f} ms at most, {quick.idxmax()}, against "
    f"{slow.min():.1f} ms at least, {slow.idxmin()})."
)
last = sent.loc[sent.groupby("stage")["ready_us"].idxmax()].set_index("stage")  # each stage's last message handed over
lesson.say(
    "The last message each asynchronous stage handed to the wire, its link time alone, beside the stage's waited: "
    + "; ".join(
        f"{st} {1e3 * metrics.link_time(link, [('all_reduce', 4 * last.loc[st, 'numel'], world)]):.1f} ms "
        f"(waited {stood[st]:.1f} ms)"
        for st in quick.index
    )
    + "."
)

whole, fixed_all = link_ms("hook-async"), sends_1g["hook-async"] * fixed
lesson.say(
    f"Of hook-async's link time ({whole:.1f} ms), its {sends_1g['hook-async']} messages' fixed cost is "
    f"{fixed_all:.1f} ms and the bytes' transfer {whole - fixed_all:.1f} ms: buckets save part of the first "
    f"({saved:.1f} ms, {100 * saved / whole:.1f} % of the link time) and leave the second as it was."
)
exposed = waits["exposed_us"]  # ms
lesson.say(
    "Each change's two stages by waited, one step each: "
    + "; ".join(
        f"{a}'s waited is {lesson.compared(stood[a], stood[b])} {b}'s ({stood[a]:.1f} against {stood[b]:.1f} ms), "
        f"its exposed {lesson.compared(exposed[a], exposed[b])} {b}'s ({exposed[a]:.1f} against {exposed[b]:.1f} ms)"
        for a, b in [("ga", "simple"), ("hook", "ga"), ("bucket", "hook"), ("bucket-async", "hook-async")]
    )
    + ". Each stage's waited as a share of its link time: "
    + "; ".join(
        f"{st} {100 * stood[st] / link_ms(st):.1f} % ({stood[st]:.1f} against {link_ms(st):.1f} ms)"
        for st in on_link.index
    )
    + "."
)
over = [st for st in on_link.index if on_link.loc[st, "waited (ms)"] > on_link.loc[st, "link time (ms)"]]
lesson.say(
    f"Waited longer for their messages than their link time, the link's whole work: {', '.join(over)}."
    if over
    else "No stage waited longer for its messages than its link time, the link's whole work."
)
d = (on_link.loc["bucket"] - on_link.loc["hook"]).round(1)  # the printed columns' changes
lesson.say(
    f"From hook to bucket, waited changes by {d['waited (ms)']:+.1f} ms: exposed by {d['exposed (ms)']:+.1f} ms and "
    f"waited − exposed, the part with the link carrying nothing, by {d['waited − exposed (ms)']:+.1f} ms; the link "
    f"time, by {d['link time (ms)']:+.1f} ms (the fixed cost of the messages buckets do not send); waited's change "
    + (
        f"is {abs(d['waited (ms)']) / abs(d['link time (ms)']):.1f} × the link time's, in size."
        if abs(d["waited (ms)"]) > abs(d["link time (ms)"])
        else "is no larger than the link time's, in size."
    )
)
for st in [st for st in on_link.index if round(exposed[st], 1) == 0 and round(stood[st], 1) > 0]:
    lesson.say(
        f"{st}'s exposed is {exposed[st]:.1f} ms: its {stood[st]:.1f} ms of waited is all waited − exposed, time with "
        "the link carrying nothing."
    )


# %% [markdown]
# For what the same stages would do at other link speeds and at 2 to 1024 ranks, see
# `docs/scaling.md` (`python -m minddp.model project`).
