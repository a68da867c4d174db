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
# `bucket-async`, and `ddp`, minddp's own `DistributedDataParallel`; the sharded rungs are in `06_sharding`),
# torch's DDP and `single` (no wrapper: each rank trains on its own examples and never communicates), with gloo over the machine's loopback interface; *the link
# run* (last section) profiles `simple` to `bucket-async` again over an *emulated link*, a modeled network. It reads
# the traces with `minddp.analysis` the way the blog this course follows ("First Steps With Distributed Data Parallelism and PyTorch Profiling",
# https://blog.underfit.ai/ddp-profiled) reads its GPU traces with HolisticTraceAnalysis (HTA), but with its own
# measures from CPU events (`docs/analysis.md`).
#
# A *message* is one whole all_reduce call of gradients (one
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
lesson.say(lesson.machine(link="in the link run"))  # the cores every timing below shares

# %%
# %dist_shutdown

# %% [markdown]
# ## Time in flight, overlap, non-compute
#
# Every table and figure below shows rank 0's trace; no table has `single`, which sends nothing. A printed line
# marked ✓ is a claim the code checks on this run; an unmarked one is measured, one step. Terms first:
#
# * the *finish*: minddp's `finish_gradient_synchronization()`, which the training loop calls after every
#   backward; a step runs several *micro-batches*, a forward and a backward each, before
#   one optimizer step. `simple` syncs in the finish after every micro-batch, `ga` (gradient accumulation) once a step;
# * the *parameter check* (`minddp.stages.checks`): before each sync's first
#   message, `simple` to `bucket-async` check that both ranks' forwards used the same parameters, with one
#   all_gather: at the start of the finish in `simple` and `ga`, in `hook` to
#   `bucket-async` in the first gradient's *autograd hook* (the function autograd calls once a gradient is ready;
#   these stages send from it). It is a collective, not a message, and a *training thread* (the Python thread,
#   and the autograd engine's where it has its own) waits for it; `ddp` and torch's DDP run none;
# * the *blocking* stages (`simple`, `ga`, `hook`, `bucket`) send each message only once the training thread has
#   the one before it back: `simple` and `ga` after a backward, `hook` and `bucket` inside the step's last
#   backward. The *asynchronous* ones (`hook-async`, `bucket-async`, `ddp`, torch's DDP) send theirs during the
#   step's last backward and need them back only after its last gradient. In all but `simple` the backwards
#   before the step's last send nothing: one sync a step.
#
# The measures on this machine (CPU, gloo):
#
# * **compute**: a training thread inside an `aten::` operator, with a core or not (forward, backward, the
#   optimizer, the stages' copies into and out of buckets);
# * **in flight**: one of gloo's threads inside a `gloo:*` range (the range is *open*): every collective, the
#   messages, the parameter check and, in `ddp` and torch's DDP, a broadcast of the model's buffers;
# * **non-compute** (HTA's name): the time in flight that is not compute: no training thread inside an operator;
# * **overlap**: the share (%) of each stage's own time in flight that is compute too.
#
# The caveat: a gloo range lasts from the moment gloo's thread picks the collective up until gloo marks it done,
# which can be after the training thread has it back; it is also *held open* until the other rank joins the same
# collective, and while gloo's thread has no core. The table and the figure do not show what held a range open (nor,
# so, where a blocking stage's overlap comes from), nor whether a difference between two rows comes from their
# stages: each row is one step, profiled at its own moment.

# %%
from IPython.display import display
from minddp.analysis import analyze_run
from minddp.analysis.timeline import draw_steps
from minddp.notebook import lesson, lesson_05

RUN = lesson.trace_dir("05_reading_traces")
result = analyze_run(RUN)
zero = lesson_05.summary(result)  # rank 0's summary row of each stage but single
shares = lesson_05.shares(zero)
checked = lesson_05.checks(RUN, zero.index)  # per stage: its parameter checks' ranges and the rest of its ranges
shares.insert(1, "of it, check (ms)", checked["check (ms)"].astype(float).round(1))
display(shares)
blocking, asynchronous = ["simple", "ga", "hook", "bucket"], ["hook-async", "bucket-async", "ddp", "torch"]
overlap, nc, fl = shares["overlap (%)"], shares["non-compute (ms)"], shares["in flight (ms)"]
above = overlap[asynchronous].min() > overlap[blocking].max()  # one profiled step each: said, not claimed
pairs = [(a, b) for a in asynchronous for b in blocking if overlap[a] > overlap[b] and nc[a] > nc[b]]
a, b = max(pairs, key=lambda p: nc[p[0]] - nc[p[1]], default=(None, None))  # the widest such pair
lesson.say(
    f"Overlap: {'every' if above else 'not every'} asynchronous stage above every blocking one"
    + (
        f", yet {a} has more non-compute than {b}: overlap is a share of a stage's own time in flight, {fl[a]} ms "
        f"against {fl[b]} ms."
        if pairs
        else "."
    )
)
ck = shares["of it, check (ms)"].drop(["ddp", "torch"])  # ddp and torch run no check
sizes = {b for stage in ck.index for b in checked.loc[stage, "check bytes"]}
lesson.claim(  # the same one-byte-a-parameter tensor in every stage
    len(sizes) == 1
    and all(checked.loc[stage, "check bytes"] for stage in ck.index)
    and checked.loc[["ddp", "torch"], "check (ms)"].eq(0).all(),
    f"Each parameter check, in every stage from simple to bucket-async, gathers the same {min(sizes, default=0)} "
    "bytes a rank; ddp and torch run none.",
)
lesson.say(
    f"So what varies in its range, {ck.min()} ms ({ck.idxmin()}) to {ck.max()} ms ({ck.idxmax()}), is how long it was "
    "held open (the caveat), not its data; the range is part of in flight, and of non-compute where no operator ran."
)
numel = lesson_05.rank0(result.buckets).groupby("stage")["numel"].apply(sorted)
n_b, n_ba = len(numel["bucket"]), len(numel["bucket-async"])
count = f"{n_b} messages each" if n_b == n_ba else f"{n_b} and {n_ba} messages"
same = "the same" if numel["bucket"] == numel["bucket-async"] else "not the same"
out = checked["outside the check (ms)"].astype(float)
lesson.say(
    f"bucket and bucket-async hand over {count}, {same} sizes; outside the check their ranges were open "
    f"{out['bucket']:.1f} and {out['bucket-async']:.1f} ms: in flight is how long ranges stay open, not how long "
    "their data takes."
)

# %% [markdown]
# One row per profiled stage, one step each; `single`, on top, is the baseline with no messages. In each row:
#
# * the forward (pale) and backward (darker) band of each micro-batch, whatever the threads did in it: *forward*
#   from the micro-batch's start to its first *autograd node*, *backward* from the first to the last autograd node
#   (one gradient function's run; the autograd hooks run inside those nodes: the check, `hook`'s and `bucket`'s
#   messages); a backward band ends before `loss.backward()` returns;
# * a tick when a message was *handed over* to be sent;
# * an orange bar while the message's gloo all_reduce range was open, held open included (the buffers' broadcast
#   is not drawn). Ranges open at once
#   (a blocking stage's too: the caveat) are drawn one below another, and each level's bars alternate two shades
#   in the order they opened. A bar narrower than a pixel need not show;
# * each parameter check (hatched orange, white-edged) while its all_gather range was open; a short one need not
#   show;
# * the finish (purple; not in `single` or torch), where wide enough to see;
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
    + (f"{' and '.join(shorter)} had a shorter step" if shorter else "None had a shorter step")
    + " than single, which sends nothing"
    + ": each is one step, profiled at its own moment, so these lengths do not rank the stages."
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
# own link (its own thread, on the same cores), which carries its messages one at a time, in order, each from just after its
# hand-over (or once the link is free, if later); the real all_reduce runs beside the modeled transfer, and the link
# delivers a message once both are done and every earlier one is delivered.
# The two runs were taken at different moments: neither's times carry over to the other. Three measures
# of the link run only:
#
# * **link time**: what rank 0's messages of a step take on the modeled link, from their sizes alone
#   (`metrics.link_time`): 2(n−1)·α + 2(n−1)/n·m·β for a message of m bytes, added up, with n ranks and the
#   `1gbit` preset's α = 50 µs and β = 8 ns a byte (1 Gbit/s); 2(n−1)·α is a message's fixed cost;
# * **waited**: the length of the union, over a step's gradient messages, of the time from rank 0's first
#   `wait()` on one (the call that returns once the message is delivered; a blocking stage calls it after each
#   hand-over, so a transfer can start before it) to its delivery. The parameter check is not a message and is not counted;
# * **exposed**: the part of that union during which rank 0's link carried a transfer (the rest, waited − exposed,
#   was a wait for the real all_reduce: the other rank or a core).

# %%
from minddp.comm.link import parse_link

LINKED = lesson.trace_dir("05_reading_traces_1gbit")
linked, link = analyze_run(LINKED), parse_link("1gbit")
on_link = lesson_05.link_table(linked, link)
display(on_link)
exposed = on_link["exposed (ms)"]  # one profiled step each: said, not claimed
below = max(exposed["hook-async"], exposed["bucket-async"]) < exposed[["simple", "ga", "hook", "bucket"]].min()
lesson.say(
    f"Exposed: hook-async {exposed['hook-async']} ms, bucket-async {exposed['bucket-async']} ms, "
    f"{'both below' if below else 'not both below'} every blocking stage."
)
per = lesson_05.link_messages(linked, link)  # per stage: messages, bytes, link time (ms)
sends, ms, nbytes = per["messages"], per["link time (ms)"], per["bytes"]
n = int(linked.summary["rank"].nunique())
fewer, fixed = sends["hook-async"] - sends["bucket-async"], 2 * (n - 1) * link.latency * 1e3  # 2(n−1)·α, ms
saved = ms["hook-async"] - ms["bucket-async"]
lesson.claim(  # 1e-9 of a link time: float rounding of sums of a few hundred terms
    fewer > 0 and nbytes["hook-async"] == nbytes["bucket-async"] and abs(saved - fewer * fixed) < 1e-9 * ms["ga"],
    f"bucket-async's buckets send {fewer} fewer messages than hook-async, the same bytes: {saved:.1f} ms less link "
    "time (fixed costs).",
)
mib = lesson_05.message_bytes(linked)[lesson_05.rank0(linked.buckets)["stage"] == "bucket-async"] / 2**20
lesson.say(  # bucket_plan closes a bucket at the parameter that takes it to the cap
    f"A bucket closes once it holds {lesson.SETTINGS.bucket_cap_mb:g} MiB or more, so it can pass that cap by up to "
    f"its last parameter: the largest here, {mib.max():.2f} MiB."
)
lead = {s: lesson_05.head_start(linked, s) for s in ["hook-async", "bucket-async"]}


def fit(s):  # the link carries one message at a time, each from its hand-over at the earliest
    if lead[s] >= ms[s]:
        return f"time enough for its {ms[s]:.1f} ms of link time"
    return f"{ms[s] - lead[s]:.1f} ms short of its {ms[s]:.1f} ms of link time, so at least that much came after it"


lesson.say(
    "Exposed also depends on when transfers start: from its first hand-over to the end of its last backward, "
    f"hook-async had {lead['hook-async']:.1f} ms, {fit('hook-async')}; bucket-async, whose first bucket goes once "
    f"all that bucket's gradients are ready, {lead['bucket-async']:.1f} ms, {fit('bucket-async')} (exposed counts "
    "only from the first wait(), after the backward)."
)
