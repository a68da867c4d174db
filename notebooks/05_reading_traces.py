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
# # 05 · Reading traces
#
# Each rank can record a profiler trace of its steps (open one in https://ui.perfetto.dev). This notebook profiles
# one step of each stage of the DDP ladder that keeps a whole replica on every rank (`03_build_up`: `simple` to
# `bucket-async`, and `ddp`, minddp's own `DistributedDataParallel`; the sharded rungs: `06_sharding`),
# torch's DDP and `single` (no wrapper: the ranks never communicate), with gloo over the machine's loopback interface;
# *the link run* (last section) profiles `simple` to `bucket-async` again over an *emulated link*, a modeled network. It reads
# the traces with `minddp.analysis` as the course's blog (https://blog.underfit.ai/ddp-profiled) reads its GPU
# traces with HolisticTraceAnalysis (HTA), but with its own measures from CPU events (`docs/analysis.md`).
#
# A *message* is one all_reduce of gradients (one
# parameter's, or a *bucket*'s: several parameters' gradients in one buffer); a *sync* is one round of messages that
# carries every gradient once.

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
    shutil.rmtree(RUN, ignore_errors=True)  # analyze_run refuses a folder that holds two runs' traces
dist.barrier()
ddp_ladder = [s for s in STAGES if s not in SHARDED_OPTIMIZER + SHARDED_GRADIENTS]  # the sharded rungs: 06
profiled = ["single", *ddp_ladder, "torch"]
for stage in profiled:
    # one step when built, then profile(): one step the profiler discards, then the one it records; the first
    # steps' one-off costs stay out of it
    lesson.Trainee(stage).profile(RUN, steps=1)
# the link run (the last section)
LINKED = lesson.trace_dir("05_reading_traces_1gbit")
if rank == 0:
    shutil.rmtree(LINKED, ignore_errors=True)
dist.barrier()
blog = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
for stage in blog:
    lesson.Trainee(stage, link="1gbit").profile(LINKED, steps=1)
lesson.say(lesson.describe())
lesson.say(lesson.machine(link="in the link run"))  # the cores every timing below shares

# %%
# %dist_shutdown

# %% [markdown]
# ## Time in flight, overlap, non-compute
#
# Every table and figure below shows rank 0's trace; no table has `single`. A printed line
# marked ✓ is a claim the code checks on this run; an unmarked one is measured, one step.
#
# * the *finish*: minddp's `finish_gradient_synchronization()`, which the training loop calls after every
#   backward; a step runs several *micro-batches* (the workload line above), a forward and a backward each, before
#   one optimizer step. `simple` syncs in the finish after every micro-batch, `ga` (gradient accumulation) once a step;
# * the *parameter check* (`minddp.stages.checks`): before each sync's first
#   message, `simple` to `bucket-async` check that both ranks' forwards used the same parameters, with one
#   all_gather: at the start of the finish in `simple` and `ga`, in `hook` to
#   `bucket-async` in the first gradient's *autograd hook* (called once a gradient is ready;
#   these stages send from it). It is a collective, not a message, and a *training thread* (the Python thread,
#   and the autograd engine's where it has its own) waits for it; `ddp` and torch's DDP run none;
# * the *blocking* stages (`simple`, `ga`, `hook`, `bucket`) send (*hand over*) each message only once the training thread has
#   the one before it back: `simple` and `ga` after a backward, `hook` and `bucket` inside the step's last
#   backward. The *asynchronous* ones (`hook-async`, `bucket-async`, `ddp`, torch's DDP) send theirs during the
#   step's last backward and need them back only after its last gradient.
#
# The measures here (CPU, gloo):
#
# * **compute**: a training thread inside an `aten::` operator, with a core or not (forward, backward, optimizer,
#   bucket copies);
# * **in flight**: one of gloo's threads inside a `gloo:*` range (the range is *open*): every collective, the
#   messages, the parameter checks (the table's checks column) and, in `ddp` and torch's DDP, a broadcast of the
#   model's buffers;
# * **overlap**: the share (%) of each stage's own time in flight that is compute too;
# * **non-compute** (HTA's name): the rest of in flight, (100 − overlap) % of it, so more overlap can still come with
#   more non-compute.
#
# The caveat: a gloo range lasts from the moment gloo's thread picks the collective up until gloo marks it done,
# which can be after the training thread has it back; it is also *held open* until the other rank joins the same
# collective, and while gloo's thread has no core. A blocking stage's training thread runs no operator while it
# waits: its overlap is compute after a collective is back, before gloo marks it done. Neither table nor figure shows
# what held a range open, nor whether a difference between rows comes from their stages: each row is one step,
# profiled at its own moment.

# %%
from IPython.display import display
from minddp.analysis import analyze_run
from minddp.analysis.timeline import draw_steps
from minddp.notebook import lesson, lesson_05

RUN = lesson.trace_dir("05_reading_traces")
result = analyze_run(RUN)
zero = lesson_05.summary(result)  # rank 0's summary row of each stage but single
checked = lesson_05.checks(RUN, zero.index)  # per stage: its parameter checks and the rest of its ranges
shares = lesson_05.shares(zero, checked)  # "checks (ms)": the part of in flight in all the step's checks
display(shares)
blocking, asynchronous = ["simple", "ga", "hook", "bucket"], ["hook-async", "bucket-async", "ddp", "torch"]
overlap = shares["overlap (%)"]
above = overlap[asynchronous].min() > overlap[blocking].max()  # one profiled step each: said, not claimed
lesson.say(f"Overlap: {'every' if above else 'not every'} asynchronous stage above every blocking one.")
tensors, accum = lesson_05.tensors(), lesson.SETTINGS.grad_accum
lesson.claim(
    lesson_05.checks_as_built(checked, accum, tensors),
    f"Each parameter check gathers {tensors} bytes a rank, as many as parameter tensors; a step holds "
    f"{accum} in simple (one a sync), 1 in ga to bucket-async, none in ddp and torch.",
)
lesson.say(lesson_05.open_line(result, shares, tensors))

# %% [markdown]
# One row per profiled stage, one step each, `single` on top. In each row:
#
# * the forward (pale) and backward (darker) band of each micro-batch, whatever the threads did in it: *forward*
#   from the micro-batch's start (before the first, the step's time is blank) to its first *autograd node*,
#   *backward* from the first to the last autograd node (one gradient function's run; the autograd hooks run inside
#   those nodes: the check, and `hook`'s and `bucket`'s messages with their waits); a backward band ends before
#   `loss.backward()` returns. An orange bar under a band is not overlap: that needs an operator running, which the
#   figure does not draw;
# * a tick when a message was handed over;
# * an orange bar while the message's gloo all_reduce range was open, held open included (the buffers' broadcast
#   is not drawn). Ranges open at once (a blocking stage's too: the caveat) are drawn one below another, in two
#   alternating shades; a bar narrower than a pixel need not show;
# * each parameter check (hatched orange, white-edged) while its all_gather range was open; a short one need not
#   show;
# * the finish (purple; not in `single` or torch, empty in `ddp`), where wide enough to see. `ddp` and torch's DDP
#   wait in an end-of-backward callback, after the last autograd node: in the blank between their last band and
#   the optimizer step;
# * the optimizer step (green) and the end of the step.

# %%
rows = lesson_05.timeline_rows(result, RUN)  # the rows draw_steps draws, with each stage's parameter checks
title = f"One step of each stage, each profiled at its own moment: run {result.run} (rank 0)"
fig = draw_steps(rows, title=title, width=11)
lesson_05.show(fig, RUN / "one_step_each_stage.png")
steps = lesson_05.step_ms(result).reindex([row["stage"] for row in rows])  # in the figure's order
shorter = [s for s in steps.index if steps[s] < steps["single"]]
lesson.say(
    "Step lengths (the step-end lines), ms: "
    + ", ".join(f"{s} {t:.0f}" for s, t in steps.items())
    + ". "
    + (f"{lesson.listed(shorter)} had a shorter step" if shorter else "None had a shorter step")
    + " than single, which sends nothing: one step each, not a ranking."
)

# %%
anatomy = lesson_05.anatomy(result, zero.index)  # per stage: messages handed over, and how many during a backward
after = list(anatomy.index[anatomy["during a backward"] == 0])
during = anatomy.drop(after)
lesson.claim(
    after == ["simple", "ga"] and (during["during a backward"] == during["handed over"]).all(),
    "simple and ga hand over no message during a backward; the others, all of theirs.",
)

# %% [markdown]
# ## The link run
#
# Its gradients' all_reduces go over `03_build_up`'s **emulated 1 Gbit/s link** (`minddp.comm.link`). Each rank has its
# own link, which carries its messages one at a time, in order, each from just after its
# hand-over (or once the link is free, if later); the real all_reduce runs beside the modeled transfer, and the link
# delivers a message once both are done and every earlier one is delivered.
# Neither run's times carry over to the other. Three measures
# of the link run only:
#
# * **link time**: what rank 0's messages of a step take on the modeled link, from their sizes alone
#   (`metrics.link_time`): 2(n−1)·α + 2(n−1)/n·m·β for a message of m bytes, added up, with n ranks and the
#   `1gbit` preset's α = 50 µs and β = 8 ns a byte (1 Gbit/s); 2(n−1)·α is a message's fixed cost;
# * **waited**: the length of the union, over a step's gradient messages, of the time from rank 0's first
#   `wait()` on one (the call that returns once the message is delivered; a blocking stage calls it after each
#   hand-over, so a transfer can start before it) to its delivery. The parameter check is not counted;
# * **exposed**: the part of that union during which rank 0's link carried a transfer (the rest, waited − exposed,
#   last column, was a wait for the real all_reduce: the other rank or a core).

# %%
from minddp.comm.link import parse_link

LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked, link = analyze_run(LINKED), parse_link("1gbit")
on_link = lesson_05.link_table(linked, link)
display(on_link)
lesson.claim(*lesson_05.fixed_costs(linked, link))
for line in lesson_05.exposed_lines(linked, link, on_link, blocking):  # one profiled step each: said, not claimed
    lesson.say(line)
